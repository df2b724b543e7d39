"""Running jobs: a queue's executor (fetcher and workers), one attempt's scope and handler
chain, and the completer that writes outcomes in batches.

`executor.QueueExecutor` claims and hands out jobs; `attempt` decides what an attempt's end
means (with the job rules, `nursery_jobs.rules`); `completer.Completer` writes the outcomes.
Nothing here knows the runtime: each part is built with exactly what it uses.
"""
