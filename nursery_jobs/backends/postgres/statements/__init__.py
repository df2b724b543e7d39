"""The SQL the backend sends: one module per concern, each statement with why it is shaped so.

Every statement is a `psycopg.sql.SQL` with ``{s}`` for the schema (and ``{seq}``, ``{fences}``,
``{schema_text}`` where a statement names the id sequence, the lock fences or the schema as a
value), rendered once per backend (`PostgresBase.__init__`) and prepared at its first use on each
pooled connection. They sit apart from the Python that sends them, as River keeps its queries in
files of their own: a statement's shape decides its plan, and the reasons for a shape are long
and belong beside the SQL, not inside the call that runs it. The statements that decide a job
rule in SQL are generated from the rules (`rules.sql_case`) or held to them by a test.
"""

from __future__ import annotations

from ....infra.pg import sql  # psycopg only through infra: import order
from .claim import STATEMENTS as CLAIM
from .coordination import STATEMENTS as COORDINATION
from .insert import STATEMENTS as INSERT
from .maintenance import STATEMENTS as MAINTENANCE
from .outcomes import STATEMENTS as OUTCOMES
from .reads import STATEMENTS as READS

__all__ = ["QUERIES"]

QUERIES: dict[str, sql.SQL] = {**INSERT, **CLAIM, **OUTCOMES, **MAINTENANCE, **READS, **COORDINATION}
"""Every statement by name: what `PostgresBase._q` renders for its schema."""
