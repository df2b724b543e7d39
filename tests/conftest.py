from __future__ import annotations

# Before anything imports psycopg: trio_asyncio must patch asyncio first (see nursery_jobs.infra.aio).
import nursery_jobs.infra.aio  # noqa: F401, I001

import pytest

from tests import pgutil

pytest_plugins = ["tests.timeouts"]


@pytest.fixture(scope="session")
def pg_url():
    """URL of a throwaway PostgreSQL database for this test session (dropped at the end)."""
    url = pgutil.create_database()
    yield url
    pgutil.drop_database(url)
