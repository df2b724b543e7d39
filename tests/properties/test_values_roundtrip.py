"""P16 -- what one backend accepts, every backend accepts and returns unchanged.

For any JSON-like value drawn below (NUL and lone surrogates in strings and keys, floats such
as -0.0, 1e16 and 1.2345678901234567e+19, ints far past 64 bits, long keys, nesting up to and
past `MAX_ARGS_DEPTH`), the same enqueue on memory, SQLite and PostgreSQL either

- succeeds on all three, and the handler receives -- and `get_job` returns -- exactly the value
  enqueued (compared as JSON text, so `-0.0` is not `0.0` and `1e16` is not `10000000000000000`), or
- fails on all three with the same error class and message, at enqueue.

Each example opens one runtime per backend (a shared SQLite file and PostgreSQL schema for the
whole test: job ids simply grow) and runs the job to completion on each.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import nursery_jobs as nj
from nursery_jobs.jobs import MAX_ARGS_DEPTH
from tests import registry

from .harness import examples

# Every code point, surrogates included, and NUL often.
_chars = st.characters(codec=None, categories=None) | st.just("\x00") | st.sampled_from("\ud800\udcff\udfff\U0010ffff")
texts = st.text(_chars, max_size=30) | st.text(_chars, min_size=2000, max_size=3000)
floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [-0.0, 0.0, 1e16, 1e20, 1.2345678901234567e19, 5e-324, 1.7976931348623157e308, -1e-320, 2.0**53 + 2]
)
ints = st.integers() | st.integers(min_value=-(10**60), max_value=10**60) | st.sampled_from([2**63, -(2**63) - 1, 2**64])
scalars = st.none() | st.booleans() | ints | floats | texts
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4), max_leaves=12
)


@st.composite
def nested(draw: st.DrawFn) -> Any:
    """A value wrapped in lists and dicts to a depth around MAX_ARGS_DEPTH."""
    value = draw(scalars)
    for _ in range(draw(st.integers(MAX_ARGS_DEPTH - 3, MAX_ARGS_DEPTH + 3))):
        value = [value] if draw(st.booleans()) else {"k": value}
    return value


args_strategy = st.dictionaries(texts, values | nested(), max_size=4)


def canonical(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True, allow_nan=False)


async def _through(backend: nj.Backend, args: dict[str, Any]) -> tuple[str, ...]:
    app = nj.App()
    seen: list[dict[str, Any]] = []

    @app.job(max_attempts=1)
    async def echo(ctx: nj.JobContext, **kwargs: Any) -> None:
        seen.append(kwargs)

    async with nj.open_runtime(app, backend=backend) as rt:
        try:
            job_id = await echo.enqueue(**args)
        except nj.NurseryJobsError as exc:
            return ("refused", type(exc).__name__, str(exc))
        receipt = await rt.wait(job_id, timeout=20)
        job = await rt.get_job(job_id)
    assert receipt.state is nj.JobState.COMPLETED, (receipt, job.errors)
    (got,) = seen
    return ("stored", canonical(got), canonical(job.args))


@pytest.fixture
def stores(request: pytest.FixtureRequest) -> dict[str, registry.Store]:
    """One store per registered backend (`tests/registry.py`); memory is the reference."""
    return {b.name: b.new_store(request) for b in registry.all_backends()}


def test_every_backend_stores_a_value_exactly_or_every_backend_refuses_it(stores: dict[str, registry.Store]) -> None:
    @settings(max_examples=examples(60))
    @given(args=args_strategy)
    def prop(args: dict[str, Any]) -> None:
        async def main() -> dict[str, tuple[str, ...]]:
            return {name: await _through(store.open(), args) for name, store in stores.items()}

        results = trio.run(main)
        for name, result in results.items():
            assert result == results["memory"], (name, results)
        if results["memory"][0] == "stored":
            assert results["memory"][1] == results["memory"][2] == canonical(args)

    prop()


def test_the_property_sees_both_sides(stores: dict[str, registry.Store]) -> None:
    """The strategy reaches values that are stored and values that are refused, and the
    values the issue names are among the stored ones (a property that never meets them is a toy)."""
    named = {
        "nul": "a\x00b",
        "surrogate": "\udcff.txt",
        "big_floats": [1e16, 1e20, 1.2345678901234567e19, -0.0],
        "big_int": 2**64 + 1,
        "key\x00": {"\ud800": 1},
        "long_key": {"k" * 5000: True},
    }
    deep: Any = 1
    for _ in range(MAX_ARGS_DEPTH + 1):
        deep = [deep]

    async def main() -> list[list[tuple[str, ...]]]:
        return [[await _through(store.open(), args) for store in stores.values()] for args in (named, {"deep": deep})]

    stored, refused = trio.run(main)
    assert len(stored) == len(stores) >= 3
    assert set(stored) == {("stored", canonical(named), canonical(named))}, stored
    assert len(set(refused)) == 1, refused
    assert refused[0][:2] == ("refused", "ArgsError") and "deeper than" in refused[0][2]
