from __future__ import annotations

import pytest

from tests import pgutil


@pytest.fixture(scope="session")
def pg_url():
    """URL of a throwaway PostgreSQL database for this test session (dropped at the end)."""
    url = pgutil.create_database()
    yield url
    pgutil.drop_database(url)
