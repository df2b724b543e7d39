"""The `nursery-jobs` command.

    nursery-jobs migrate --database-url postgresql://user@host/db [--schema nursery_jobs]

Built on argparse from the standard library: the command has a handful of sub-commands and
flags, and a CLI framework would add a dependency to every service that embeds the runtime.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .errors import ConfigError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nursery-jobs", description="nursery_jobs administration")
    sub = parser.add_subparsers(dest="command", required=True)
    migrate = sub.add_parser("migrate", help="create or upgrade the PostgreSQL schema")
    migrate.add_argument("--database-url", required=True, help="postgresql://user@host:port/dbname")
    migrate.add_argument(
        "--schema", default=None, help="schema name (default: the URL's ?schema= or 'nursery_jobs')"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "migrate":
        return _migrate(args.database_url, args.schema)
    return 2  # pragma: no cover - argparse rejects unknown commands


def _migrate(url: str, schema: str | None) -> int:
    from .infra.redact import redact
    from .backends.postgres import migrate, parse_postgres_url
    from .infra.pg import psycopg

    try:
        conninfo, opts = parse_postgres_url(url)
        name = schema or opts["schema"]
        applied = migrate(conninfo, name)
    except ConfigError as exc:
        print(f"nursery-jobs migrate: {redact(str(exc), url)}", file=sys.stderr)
        return 2
    except psycopg.Error as exc:
        # libpq's messages can quote the URL back (the password with it) when it cannot parse it.
        message = redact(" ".join(str(exc).split()), url)
        print(f"nursery-jobs migrate: database error: {message}", file=sys.stderr)
        return 1
    if applied:
        print(f"schema {name!r}: applied {', '.join(applied)}")
    else:
        print(f"schema {name!r}: up to date")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
