"""The only package of nursery_jobs that owns tasks, threads and event loops.

Everything else in the library (and in a service built on it) asks this package for a scope
instead of spawning: `owner.open_owner` gives a named, introspectable nursery whose children's
errors propagate; `owner.open_children` gives a job attempt its own child tasks;
`threads.run_blocking` runs blocking code on a bounded, never-abandoned thread; `runner.run_trio`
is the one `trio.run`. The spawn lint (`nursery-jobs-lint`) enforces the boundary.
"""
