"""`check_at_least_once` on PostgreSQL judges a psycopg handler by its code, not by the driver's
round trips.

A handler that writes through `ctx.client.transaction()` made the check fail on an idempotent
handler ("yielded 6 times this run, not the 7 of its clean run"): a pool connection opened in
one run and not the next, so one run had a yield more. Each run here starts on a fresh pool
(nothing connected, nothing prepared: the first use, every time), 20 runs per handler, and
every verdict must be right: the idempotent handler passes, the one that counts twice fails.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import nursery_jobs as nj
from nursery_jobs.testing import open_test_backend, open_test_runtime

RUNS = 20

app = nj.App()
app.queue("work", max_workers=2, timeout=30)


def _table(schema: str, name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))


@app.job(queue="work")
async def pay(ctx: nj.JobContext, schema: str, order: str) -> None:
    async with ctx.client.transaction() as conn:
        await conn.execute(sql.SQL("INSERT INTO {} VALUES (%s) ON CONFLICT DO NOTHING").format(_table(schema, "paid")), (order,))
    async with ctx.client.transaction() as conn:
        await conn.execute(sql.SQL("UPDATE {} SET receipts = 1 WHERE id = %s").format(_table(schema, "paid")), (order,))


@app.job(queue="work")
async def pay_twice(ctx: nj.JobContext, schema: str, order: str) -> None:
    async with ctx.client.transaction() as conn:
        await conn.execute(sql.SQL("INSERT INTO {} VALUES (%s) ON CONFLICT DO NOTHING").format(_table(schema, "paid")), (order,))
    async with ctx.client.transaction() as conn:  # run again after the first commit, it counts twice
        await conn.execute(sql.SQL("UPDATE {} SET receipts = receipts + 1 WHERE id = %s").format(_table(schema, "paid")), (order,))


@app.job(queue="work")
async def pay_once_seen(ctx: nj.JobContext, schema: str, order: str) -> None:
    async with ctx.client.transaction() as conn:
        cur = await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(_table(schema, "seen")))
        if (await cur.fetchone())[0] == 0:  # state the test's reset leaves alone
            await conn.execute(sql.SQL("INSERT INTO {} VALUES (1)").format(_table(schema, "seen")))  # the other path
        paid = sql.SQL("INSERT INTO {} VALUES (%s) ON CONFLICT DO NOTHING").format(_table(schema, "paid"))
        await conn.execute(paid, (order,))  # the payment


class Tables:
    """The service's tables, read and reset on a connection of the test's own."""

    def __init__(self, conninfo: str, schema: str) -> None:
        self.conn = psycopg.connect(conninfo, autocommit=True)
        self.schema = schema
        self.conn.execute(
            sql.SQL("CREATE TABLE {} (id text PRIMARY KEY, receipts int NOT NULL DEFAULT 0); CREATE TABLE {} (n int)").format(
                _table(schema, "paid"), _table(schema, "seen")
            )
        )

    def reset(self) -> None:
        self.conn.execute(sql.SQL("DELETE FROM {}").format(_table(self.schema, "paid")))

    def observe(self) -> list[tuple[str, int]]:
        return self.conn.execute(sql.SQL("SELECT id, receipts FROM {} ORDER BY id").format(_table(self.schema, "paid"))).fetchall()


def line_of(fn: object, marker: str) -> int:
    lines, start = inspect.getsourcelines(fn)  # type: ignore[arg-type]
    return next(i for i, line in enumerate(lines, start) if marker in line)


def _fast(pg_url: str) -> str:
    """`pg_url` without waiting for the WAL flush at each commit: these runs commit hundreds of
    times, and nothing here outlives the test."""
    return pg_url + "?options=-c%20synchronous_commit%3Doff"


async def _verdicts(pg_url: str, tmp_path: Path, kind: nj.JobKind) -> list[str]:
    """The check's verdict on `kind` in each of `RUNS` runs, each on a fresh pool (the schema
    shown as ``<schema>``)."""
    verdicts = []
    async with open_test_backend(_fast(pg_url), tmp_path) as backend:
        tables = Tables(backend.conninfo, backend.schema)  # type: ignore[attr-defined]
        try:
            for _ in range(RUNS):
                async with open_test_runtime(app, backend=backend) as rt:
                    try:
                        tried = await nj.testing.check_at_least_once(
                            kind, {"schema": tables.schema, "order": "A-1"}, observe=tables.observe, reset=tables.reset
                        )
                        verdicts.append(f"idempotent ({tried} interruptions)")
                    except nj.testing.NotIdempotent as exc:
                        verdicts.append(f"not idempotent: {str(exc).splitlines()[0]}".replace(tables.schema, "<schema>"))
                    except AssertionError as exc:
                        verdicts.append(f"no verdict: {exc}")
                    assert rt.backend is backend
                await backend.close()  # the next run starts on a fresh pool: connects and prepares anew
        finally:
            tables.conn.close()
    return verdicts


async def test_an_idempotent_psycopg_handler_passes_every_time(pg_url, tmp_path, autojump_clock):
    verdicts = await _verdicts(pg_url, tmp_path, pay)
    assert verdicts == ["idempotent (7 interruptions)"] * RUNS, "\n".join(verdicts)


async def test_a_psycopg_handler_that_counts_twice_fails_every_time(pg_url, tmp_path, autojump_clock):
    verdicts = await _verdicts(pg_url, tmp_path, pay_twice)
    wrong = (
        "not idempotent: pay_twice(schema='<schema>', order='A-1') is not idempotent: run again after an interruption, "
        "its effects differ from one clean run (1 of 7 interruptions):"
    )
    assert verdicts == [wrong] * RUNS, "\n".join(verdicts)


async def test_a_path_that_differs_is_named_by_its_line_and_its_call(pg_url, tmp_path, autojump_clock, monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[3])  # file names in the message are relative to the working directory
    async with open_test_backend(_fast(pg_url), tmp_path) as backend:
        tables = Tables(backend.conninfo, backend.schema)  # type: ignore[attr-defined]
        try:
            async with open_test_runtime(app, backend=backend):
                with pytest.raises(AssertionError, match="took another path than its clean run") as failed:
                    await nj.testing.check_at_least_once(
                        pay_once_seen, {"schema": tables.schema, "order": "A-1"}, observe=tables.observe, reset=tables.reset
                    )
        finally:
            tables.conn.close()
    here = Path(__file__).relative_to(Path.cwd())
    other, paid = line_of(pay_once_seen.fn, "# the other path"), line_of(pay_once_seen.fn, "# the payment")
    assert (
        f"its checkpoint 3 was {here}:{paid} in pay_once_seen, waiting in psycopg.connection_async.AsyncConnection.execute, "
        f"where the clean run's is {here}:{other} in pay_once_seen, waiting in psycopg.connection_async.AsyncConnection.execute"
    ) in str(failed.value)
