"""What a failed call means, read from its SQLSTATE.

The backend must tell apart four things that psycopg reports as exceptions: the connection is gone
(nothing says whether the statement ran: retry it only if it is safe to repeat), the server rolled
the whole transaction back (deadlock, serialization failure: repeatable), the server is out of a
resource or failed internally (retrying makes it worse), and the statement itself is wrong
(retrying fails again). psycopg's exception classes do not draw these lines: it files statement
errors such as 54 (program limit exceeded) under `OperationalError`, the class it also uses for a
dropped connection. So the kind is read from the SQLSTATE the server sent (`failure_kind`), and
only an error with none is judged by its class.
"""

from __future__ import annotations

import enum

from ...infra.pg import ConnectFailed, RoundTripTimeout, psycopg

__all__ = ["FailureKind", "failure_kind", "one_line", "sqlstate"]


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


class FailureKind(enum.Enum):
    LOST = "lost"
    """The connection is gone or never came up: nothing tells whether the statement ran."""
    ROLLED_BACK = "rolled back"
    """The server undid the whole transaction (deadlock, serialization failure): repeatable."""
    RESOURCE = "resource"
    """The server lacks a resource (disk, memory, connections) or failed internally."""
    STATEMENT = "statement"
    """Any other error the server returned for the statement: repeating it fails again."""
    CLIENT = "client"
    """psycopg refused the call before sending it."""


def sqlstate(exc: BaseException) -> str | None:
    if not isinstance(exc, psycopg.Error) or isinstance(exc, (ConnectFailed, RoundTripTimeout)):
        return None
    return exc.sqlstate or exc.diag.sqlstate


def failure_kind(exc: psycopg.Error) -> FailureKind:
    """What happened, by SQLSTATE rather than by psycopg's class: psycopg files several classes
    of statement errors (53 insufficient resources, 54 program limit exceeded, 55 object not in
    prerequisite state, ...) under `OperationalError`, the class it also uses for a dropped
    connection, and only a dropped connection may be retried as one."""
    if isinstance(exc, (ConnectFailed, RoundTripTimeout)):
        return FailureKind.LOST
    state = sqlstate(exc)
    if state is None:
        # No answer from the server: a closed or broken connection (psycopg's own
        # OperationalError), or a call psycopg refused before sending anything.
        return FailureKind.LOST if isinstance(exc, psycopg.OperationalError) else FailureKind.CLIENT
    if state.startswith("08") or state.startswith("57P") or state == "40003":
        # Connection exceptions; the server ending the session (admin, crash or fast shutdown,
        # starting up, database dropped, idle session timeout); "statement completion unknown".
        return FailureKind.LOST
    if state.startswith("40"):
        return FailureKind.ROLLED_BACK
    if state[:2] in ("53", "58", "XX"):
        return FailureKind.RESOURCE
    return FailureKind.STATEMENT
