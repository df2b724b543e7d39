"""The app the worker-command tests run with `nursery-jobs worker tests/processes/cli_app.py:app`.

`record` appends a line to the file named by CLI_APP_RECORD, so a test sees what ran without
reading logs; `fail` always raises, so its attempts log; `leaky` logs a URL with a password, which
the worker's log output must redact.
"""

from __future__ import annotations

import logging
import os

import nursery_jobs as nj

app = nj.App()
app.queue("work", max_workers=2, timeout=10)
app.queue("other", max_workers=1, timeout=10)

QUICK = nj.RetryPolicy(base=0.05, factor=1.0, cap=0.05, jitter=0.0)


@app.job(queue="work")
async def record(ctx: nj.JobContext, n: int) -> None:
    with open(os.environ["CLI_APP_RECORD"], "a") as f:
        f.write(f"{ctx.id} {n}\n")


@app.job(queue="work", max_attempts=2, retry=QUICK)
async def fail(ctx: nj.JobContext, n: int) -> None:
    raise ValueError(f"no luck with {n}\nsecond line")


@app.job(queue="work")
async def leaky(ctx: nj.JobContext) -> None:
    logging.getLogger("cli_app").warning("connecting to postgresql://svc:Hunter2pw@db.internal/app")


not_an_app = 42


broken = nj.App()
"""An app whose resource cannot open: the worker must say so in one line and claim nothing."""


@broken.resource
async def mailer():
    raise ConnectionRefusedError("smtp.internal:25 refused the connection")
    yield  # an async generator, as @app.resource requires
