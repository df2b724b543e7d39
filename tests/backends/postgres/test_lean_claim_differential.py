"""The lean claim against the full statement: random tables (plain, keyed, rate-keyed and scheduled jobs), each claimed once starting lean every time and once by the full statement only, must give the same jobs in the same order, and the same next_due whenever the claim did not fill its limit; two backends forced lean never run more than the limit of a key; a keyed job another process enqueues into a queue on the lean path is parked and then claimed in order."""
from __future__ import annotations

import os
import random

import psycopg
import trio

from nursery_jobs.backends import NewJob, Outcome, OutcomeKind
from nursery_jobs.backends.postgres import PostgresBackend
from tests import pgutil

T0 = 1_000_000.0
TRIALS = 150 if os.environ.get("NURSERY_JOBS_HYPOTHESIS_PROFILE") == "nightly" else 25
"""Random tables the differential test claims both ways (the nightly profile runs all 150)."""


def job(priority=0, *, run_at=None, key=None, most=None, rate=None, queue="q"):
    return NewJob("k", queue, "{}", priority, run_at, 3, None, key, (most or 1) if key else None, rate, 1 if rate else None, 60.0 if rate else None)


async def pair(pg_url, clock):
    schema = pgutil.new_schema(pg_url)
    a = PostgresBackend(pg_url, schema=schema, poll_interval=None, clock=lambda: clock[0])
    b = PostgresBackend(pg_url, schema=schema, poll_interval=None, clock=lambda: clock[0])
    for x in (a, b):
        x.check_budget(4)
        await x.open()
    return a, b, schema


async def test_keyed_job_from_other_process_in_lean_queue(pg_url):
    clock = [T0]
    a, b, schema = await pair(pg_url, clock)
    try:
        await a.claim("q", 1)
        (run,) = await b.insert_many([job(key="x")])
        (r,) = (await b.claim("q", 1)).jobs  # x full, held by b
        a._lean["q"] = 0
        k, p1, p2 = [i.id for i in await b.insert_many([job(5, key="x"), job(1), job(0)])]
        got = [j.id for j in (await a.claim("q", 1)).jobs]
        assert got == [p1], got
        with psycopg.connect(pg_url, autocommit=True) as c:
            (parked,) = c.execute(f'SELECT parked FROM "{schema}".jobs WHERE id=%s', (k,)).fetchone()
        assert parked
        await b.finish_many([Outcome(r.id, r.attempt, OutcomeKind.COMPLETED)])
        a._lean["q"] = 0
        got = [j.id for j in (await a.claim("q", 5)).jobs]
        assert got == [k, p2], got
    finally:
        await a.close()
        await b.close()


async def test_no_overshoot_and_order_under_concurrent_lean_claims(pg_url):
    clock = [T0]
    a, b, schema = await pair(pg_url, clock)
    rnd = random.Random(7)
    try:
        jobs = []
        for i in range(400):
            kind = rnd.random()
            if kind < 0.15:
                jobs.append(job(rnd.randint(0, 3), key=rnd.choice("xyz"), most=None))
            elif kind < 0.25:
                jobs.append(job(rnd.randint(0, 3), run_at=T0 + rnd.random() * 5))
            else:
                jobs.append(job(rnd.randint(0, 3)))
        await a.insert_many(jobs)
        running: dict[int, str | None] = {}
        meta = {}
        with psycopg.connect(pg_url, autocommit=True) as c:
            for i, k, m in c.execute(f'SELECT id, concurrency_key, max_concurrent FROM "{schema}".jobs'):
                meta[i] = (k, m)
        done = 0

        async def worker(be, n):
            nonlocal done
            for _ in range(300):
                be._lean["q"] = 0  # always start lean
                res = await be.claim("q", n)
                for j in res.jobs:
                    running[j.id] = meta[j.id][0]
                with psycopg.connect(pg_url, autocommit=True) as c:
                    bad = c.execute(f'SELECT concurrency_key, count(*) FROM "{schema}".jobs WHERE state = %s AND concurrency_key IS NOT NULL GROUP BY 1 HAVING count(*) > 1', ("running",)).fetchall()
                assert not bad, bad
                await trio.sleep(0)
                fin = [j for j in res.jobs]
                rnd.shuffle(fin)
                if fin:
                    await be.finish_many([Outcome(j.id, j.attempt, OutcomeKind.COMPLETED) for j in fin])
                    for j in fin:
                        running.pop(j.id, None)
                    done += len(fin)
                clock[0] += 0.05
                if done >= 400:
                    return

        async with trio.open_nursery() as n:
            n.start_soon(worker, a, 3)
            n.start_soon(worker, b, 5)
        clock[0] += 100
        for _ in range(50):
            a._lean["q"] = 0
            res = await a.claim("q", 50)
            if not res.jobs:
                break
            await a.finish_many([Outcome(j.id, j.attempt, OutcomeKind.COMPLETED) for j in res.jobs])
            done += len(res.jobs)
        assert done == 400, done
    finally:
        await a.close()
        await b.close()


async def test_lean_result_equals_full_result(pg_url):
    """Same data in two schemas: one claimed lean-first, one full only; compare ids and next_due."""
    rnd = random.Random(11)
    for trial in range(TRIALS):
        clock = [T0]
        spec = []
        for i in range(rnd.randint(0, 20)):
            r = rnd.random()
            if r < 0.2:
                spec.append(job(rnd.randint(0, 2), key=rnd.choice("xyz"), most=rnd.choice([1, 1, 2])))
            elif r < 0.3:
                spec.append(job(rnd.randint(0, 2), rate="r"))
            elif r < 0.5:
                spec.append(job(rnd.randint(0, 2), run_at=T0 + rnd.choice([1, 3, 7])))
            else:
                spec.append(job(rnd.randint(0, 2)))
        outs = []
        for lean in (True, False):
            clock[0] = T0
            be = PostgresBackend(pg_url, schema=pgutil.new_schema(pg_url), poll_interval=None, clock=lambda: clock[0])
            be.check_budget(1)
            await be.open()
            try:
                await be.insert_many(spec)
                trace = []
                for step in range(8):
                    if lean:
                        be._lean["q"] = 0
                    else:
                        be._lean.pop("q", None)
                    limit = random.Random(trial * 100 + step).randint(1, 6)
                    res = await be.claim("q", limit)
                    # A claim that filled its limit may report no next slot where the full
                    # statement reports one: the full scan reads on past the prefix up to the
                    # next startable row, and a rate-keyed row there is parked with its slot
                    # reported, where the lean one reads `limit` rows and leaves it to the next
                    # claim (which a filled claim's fetcher makes as soon as a slot frees).
                    due = res.next_due if len(res.jobs) < limit else "filled"
                    trace.append(([j.id for j in res.jobs], due))
                    if step % 2:
                        await be.finish_many([Outcome(j.id, j.attempt, OutcomeKind.COMPLETED) for j in res.jobs])
                    clock[0] += 2
                outs.append(trace)
            finally:
                await be.close()
        assert outs[0] == outs[1], (trial, outs)
