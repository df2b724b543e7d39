"""What infra's PostgreSQL bridge takes from psycopg beyond its documented API, pinned.

`infra.pg.TrioConnection` replaces the one method where psycopg's `AsyncConnection` waits
(`wait`) and its asyncio lock (`lock`), and closes through `_closed`; its cached cursors convert
their statements with a `PostgresQuery` subclass that keeps psycopg's parse
(`_query2pg_nocache`) of a long statement (`_query_cls`); a lent connection is given back with
its notice and notify handlers as they were (`_notice_handlers`, `_notify_handlers`) and its
backlog of notifications dropped where psycopg keeps one (`_notifies_backlog`); `infra.aio` re-points
`psycopg.waiting.get_running_loop` when psycopg was imported before trio-asyncio. None of these
is psycopg's public API, so pyproject.toml pins psycopg to the versions they were checked on,
and this file fails loudly, naming the name, on a psycopg that changed one of them.
"""

from __future__ import annotations

import inspect
import subprocess
import sys

import psycopg
import psycopg.waiting

from nursery_jobs.infra.pg import TrioConnection

CHECKED = ((3, 2), (3, 3))
"""psycopg minor versions the bridge was checked on (keep in step with pyproject.toml)."""


def test_psycopg_is_a_version_the_bridge_was_checked_on():
    major_minor = tuple(int(x) for x in psycopg.__version__.split(".")[:2])
    assert major_minor in CHECKED, f"psycopg {psycopg.__version__}: check infra/pg against it, then add it here"


def test_the_names_the_bridge_overrides_still_exist_with_their_shape():
    wait = inspect.signature(psycopg.AsyncConnection.wait)
    assert list(wait.parameters)[:2] == ["self", "gen"], wait  # driven with psycopg's generators
    assert "timeout" in wait.parameters  # notifies() passes it
    assert TrioConnection.wait is not psycopg.AsyncConnection.wait
    import psycopg._connection_base as base
    import psycopg.connection_async as conn_async

    async_source = inspect.getsource(conn_async)
    assert "self.lock = " in async_source and "async with self.lock" in async_source, (
        "AsyncConnection no longer takes self.lock: TrioConnection replaces it"
    )
    assert "self._closed" in inspect.getsource(base), "BaseConnection no longer has _closed: TrioConnection.close_now sets it"
    for name in ("self._notice_handlers: list", "self._notify_handlers: list"):
        assert name in inspect.getsource(base), f"BaseConnection no longer has {name}: TrioConnection.take_back restores it"
    assert callable(psycopg.waiting.wait) and hasattr(psycopg.waiting, "get_running_loop")


def test_the_query_conversion_the_cached_cursors_override_still_has_its_shape():
    import psycopg._cursor_base as cursor_base
    from psycopg import _queries

    assert inspect.getsource(cursor_base.BaseCursor._convert_query).count("self._query_cls(") == 1, (
        "cursors no longer build their query with _query_cls: TrioConnection.cached_cursor sets it"
    )
    convert = inspect.getsource(_queries.PostgresQuery.convert)
    flat = " ".join(convert.replace("(self.query", "self.query").replace("self._parts) =", "self._parts =").split())
    assert "self.query, self._want_formats, self._order, self._parts = f(" in flat, (  # 3.2 puts them in ( )
        "PostgresQuery.convert no longer sets these four from the parse: infra.pg's _ParsedOnce does"
    )
    assert "self.dump(vars)" in convert
    assert list(inspect.signature(_queries._query2pg_nocache).parameters) == ["query", "encoding"]


def test_psycopg_imported_before_trio_asyncio_still_works_under_trio_asyncio():
    """Before: every async psycopg call under trio-asyncio failed ("no running event loop")."""
    code = (
        "import psycopg, asyncio\n"
        "import nursery_jobs.infra.aio\n"
        "import psycopg.waiting\n"
        "assert psycopg.waiting.get_running_loop is asyncio.get_running_loop, 'not re-pointed'\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
