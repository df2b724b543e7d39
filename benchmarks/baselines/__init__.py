"""Baselines measured in the same process as the runtime they are compared with.

This is the one directory outside `nursery_jobs/infra/` where the spawn lint allows raw Trio
(`[tool.nursery_jobs.lint] allow` in pyproject.toml): a baseline measures the shape of the work
*without* the runtime, so it has to own its tasks itself.
"""
