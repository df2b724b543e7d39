"""The `nursery-jobs` command: `migrate`, and the commands an operator runs a service with.

    nursery-jobs migrate --database-url postgresql://user@host/db [--schema nursery_jobs]

Built on click. The command grew from one sub-command to several that share options (the
backend URL and its environment variable, the logging flags) and that must each answer a user's
mistake with one line and no traceback; click gives that (usage errors, `--help` laid out from
the docstrings, options read from the environment) for one small dependency with none of its
own. typer would add rich and typing-based declarations for a handful of flags; argparse would
need the same error handling and help layout written by hand.

Every command answers a user's error (a bad URL, an unreachable server, a schema that is not an
identifier) with one line on stderr, the password redacted, and exit code 2 for what the user
must change in the command line or the configuration, 1 for what went wrong while running.
"""

from __future__ import annotations

import sys
from typing import Sequence

import click

from ..errors import ConfigError
from ..infra.redact import redact

__all__ = ["main"]

BACKEND_ENV = "NURSERY_JOBS_BACKEND"
"""The environment variable every command reads the backend URL from when none is given."""

_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class Failure(click.ClickException):
    """A user's error, shown as one line: ``nursery-jobs <command>: <message>``."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        ctx = click.get_current_context(silent=True)
        self.command = ctx.command_path if ctx is not None else "nursery-jobs"

    def show(self, file: object = None) -> None:
        click.echo(f"{self.command}: {self.format_message()}", err=True)


class RunFailure(Failure):
    """What went wrong while running (a server that cannot be reached): exit code 1."""

    exit_code = 1


@click.group(context_settings=_CONTEXT)
def cli() -> None:
    """Run and administer nursery_jobs services.

    Every command that takes a backend URL reads it from the NURSERY_JOBS_BACKEND environment
    variable when it is not given on the command line.
    """


@cli.command(context_settings=_CONTEXT)
@click.option(
    "--database-url",
    required=True,
    envvar=BACKEND_ENV,
    show_envvar=True,
    metavar="URL",
    help="The PostgreSQL database, e.g. postgresql://user@host:5432/dbname.",
)
@click.option(
    "--schema",
    default=None,
    metavar="NAME",
    help="The schema to create or upgrade (default: the URL's ?schema=, else 'nursery_jobs').",
)
def migrate(database_url: str, schema: str | None) -> None:
    """Create or upgrade the PostgreSQL schema.

    Applies every migration the schema lacks, in one transaction, and says which; running it
    again on an up-to-date schema changes nothing, and several processes running it at once
    wait for each other. Run it before starting workers on a new database, and after
    upgrading nursery_jobs.
    """
    from ..backends.postgres import migrate as apply_migrations
    from ..backends.postgres import parse_postgres_url
    from ..infra.pg import psycopg

    url = database_url
    try:
        conninfo, opts = parse_postgres_url(url)
        name = schema or opts["schema"]
        applied = apply_migrations(conninfo, name)
    except ConfigError as exc:
        raise Failure(redact(str(exc), url)) from None
    except psycopg.Error as exc:
        # libpq's messages can quote the URL back (the password with it) when it cannot parse it.
        message = redact(" ".join(str(exc).split()), url)
        raise RunFailure(f"database error: {message}") from None
    if applied:
        click.echo(f"schema {name!r}: applied {', '.join(applied)}")
    else:
        click.echo(f"schema {name!r}: up to date")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default: the process's) and return its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = cli.main(args=args, prog_name="nursery-jobs", standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo("nursery-jobs: aborted", err=True)
        return 1
    return result if isinstance(result, int) else 0
