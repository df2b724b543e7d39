"""Integrations built on the public middleware (`nj.Middleware`), each behind an extra of its own:
`contrib.prometheus` (``nursery_jobs[prometheus]``), `contrib.otel` (``nursery_jobs[otel]``).
Nothing here is imported by the package itself, so the core runs without any of them installed."""
