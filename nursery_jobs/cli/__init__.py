"""The `nursery-jobs` command: `migrate`, and the commands an operator runs a service with.

    nursery-jobs worker MODULE:APP [--backend URL] [--queues a,b] [--grace S]
                        [--log-level L] [--log-format text|json]
    nursery-jobs enqueue KIND [--args JSON] [--app MODULE:APP] [--backend URL] [--delay S]
                         [--priority N] [--unique-key K] [--queue Q] [--max-attempts N]
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

import logging
import os
import sys
from typing import Any, Callable, Sequence, TypeVar

import click

from ..app import JobKind
from ..errors import ArgsError, ConfigError, NurseryJobsError, UnknownJob
from ..jobs import JobContext
from ..infra.redact import redact
from .failure import Failure, RunFailure
from .loading import load_app
from .logs import FORMATS, LEVELS

__all__ = ["main"]

log = logging.getLogger("nursery_jobs")

BACKEND_ENV = "NURSERY_JOBS_BACKEND"
"""The environment variable every command reads the backend URL from when none is given."""
APP_ENV = "NURSERY_JOBS_APP"
"""The environment variable `enqueue` reads its ``--app MODULE:APP`` from when none is given."""

_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=_CONTEXT)
def cli() -> None:
    """Run and administer nursery_jobs services.

    Every command that takes a backend URL reads it from the NURSERY_JOBS_BACKEND environment
    variable when it is not given on the command line.
    """


F = TypeVar("F", bound=Callable[..., Any])


def _backend_option(what: str) -> Callable[[F], F]:
    return click.option(
        "--backend",
        envvar=BACKEND_ENV,
        show_envvar=True,
        required=True,
        metavar="URL",
        help=f"{what}: sqlite:///path/jobs.db or postgresql://user@host/db?schema=jobs.",
    )


@cli.command(context_settings=_CONTEXT)
@click.argument("app_spec", metavar="MODULE:APP")
@_backend_option("Where the jobs are")
@click.option(
    "--queues",
    metavar="A,B",
    default=None,
    help="Work only these queues, comma-separated (default: every queue the app declares).",
)
@click.option(
    "--grace",
    type=float,
    default=None,
    metavar="SECONDS",
    help="At shutdown, how long running jobs get to finish before they are interrupted (default: 20).",
)
@click.option(
    "--log-level",
    type=click.Choice(LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
    help="The least severe records shown (the runtime logs each failed attempt as a warning).",
)
@click.option(
    "--log-format",
    type=click.Choice(FORMATS),
    default="text",
    show_default=True,
    help="text: one readable line per record; json: one JSON object per line, with every field.",
)
def worker(app_spec: str, backend: str, queues: str | None, grace: float | None, log_level: str, log_format: str) -> int:
    """Run the app's queues, with its resources open, until SIGINT or SIGTERM.

    MODULE:APP names the nursery_jobs.App: a dotted module name (looked up in the current
    directory, then the installed packages) or a path to a .py file, then the App's attribute
    name (default: app), e.g. myservice.jobs:app or examples/service_jobs.py:app.

    The first SIGINT or SIGTERM starts the graceful shutdown: no new job is claimed, running jobs
    get --grace seconds, what is still running then is interrupted and, on a durable backend,
    available again at once, for any worker. A second signal skips what is left of the grace. A clean
    shutdown exits 0.
    """
    from ..runtime import Runtime
    from ..runtime import run as run_runtime
    from .logs import configure

    configure(log_level, log_format)
    app = load_app(app_spec)
    names = _queue_names(queues, list(app.queues))
    box: list[Runtime] = []

    async def serve(rt: Runtime) -> None:
        box.append(rt)
        worked = list(rt.executors)
        log.info(
            "worker %d started: %s on %s (queues %s)",
            os.getpid(),
            app_spec,
            rt.backend.url,
            ", ".join(worked) or "none",
            extra={"event": "worker_started", "app": app_spec, "backend": rt.backend.url, "queues": worked, "pid": os.getpid()},
        )
        # The worker has nothing to do but let the queues run, until the first signal.
        await rt.shutdown_requested.wait()

    try:
        run_runtime(serve, app=app, backend=backend, grace=grace, queues=names)
    except ConfigError as exc:
        raise Failure(redact(str(exc), backend)) from None
    except NurseryJobsError as exc:
        raise RunFailure(redact(str(exc), backend)) from None
    interrupted = box[0].interrupted if box else []
    log.info(
        "worker %d stopped%s",
        os.getpid(),
        f": {len(interrupted)} running jobs were interrupted and given back" if interrupted else "",
        extra={"event": "worker_stopped", "app": app_spec, "pid": os.getpid(), "interrupted": interrupted},
    )
    return 0


def _queue_names(given: str | None, declared: list[str]) -> list[str] | None:
    """--queues as a list (None: every declared queue); an unknown name is a one-line error."""
    if given is None:
        return None
    names = [n.strip() for n in given.split(",") if n.strip()]
    if not names:
        raise Failure(f"--queues {given!r} names no queue; the app declares: {', '.join(declared)}")
    unknown = [n for n in names if n not in declared]
    if unknown:
        raise Failure(
            f"--queues names {', '.join(repr(n) for n in unknown)}, which the app does not declare; "
            f"it declares: {', '.join(declared)}"
        )
    return list(dict.fromkeys(names))


@cli.command(context_settings=_CONTEXT)
@click.argument("kind")
@click.option(
    "--args",
    "args_json",
    default="{}",
    show_default=True,
    metavar="JSON",
    help="The handler's keyword arguments, as a JSON object: '{\"user_id\": 42}'.",
)
@click.option(
    "--app",
    "app_spec",
    envvar=APP_ENV,
    show_envvar=True,
    default=None,
    metavar="MODULE:APP",
    help="Check KIND and --args against the app's declaration and take its queue, attempts and "
    "priority from it (recommended).",
)
@_backend_option("Where to store the job")
@click.option("--delay", type=float, default=None, metavar="SECONDS", help="Run it this many seconds from now.")
@click.option("--priority", type=int, default=None, metavar="N", help="Higher runs first (default: the kind's, else 0).")
@click.option(
    "--unique-key",
    default=None,
    metavar="KEY",
    help="While a job with this key is not final, print its id and add nothing (safe to run from cron).",
)
@click.option(
    "--queue",
    default=None,
    metavar="NAME",
    help="Without --app only: the queue KIND runs on (default: 'default', the queue of an @app.job "
    "that names none).",
)
@click.option(
    "--max-attempts",
    type=int,
    default=None,
    metavar="N",
    help="Attempts before the job is discarded (default: the kind's with --app, else 25, @app.job's).",
)
def enqueue(
    kind: str,
    args_json: str,
    app_spec: str | None,
    backend: str,
    delay: float | None,
    priority: int | None,
    unique_key: str | None,
    queue: str | None,
    max_attempts: int | None,
) -> int:
    """Enqueue one job of KIND and print its id.

    With --app, the job is what the service's own `await kind.enqueue(**args)` would make: the
    kind must be declared, --args must fit its handler, and its queue, attempts and priority are
    the declaration's unless --max-attempts or --priority says otherwise. Without it, nothing
    about the kind is known here: the job goes to --queue (default 'default') as given, and a
    wrong name, queue or args are only found by the worker (it discards a job of a kind it does
    not register, or whose args do not fit the handler, without running it) or never (a queue no
    worker runs).
    """
    import json

    from ..app import EnqueueOptions
    from ..backends import open_backend
    from ..infra.runner import run_trio

    try:
        args = json.loads(args_json)
    except ValueError as exc:
        raise Failure(f"--args is not valid JSON ({exc}); give an object such as '{{\"user_id\": 42}}'") from None
    if not isinstance(args, dict):
        shown = args_json if len(args_json) <= 80 else args_json[:77] + "..."
        raise Failure(f"--args must be a JSON object of keyword arguments, not {type(args).__name__}: {shown}")
    if max_attempts is not None and max_attempts < 1:
        raise Failure(f"--max-attempts must be an int >= 1, not {max_attempts!r}")
    try:
        if app_spec is not None:
            if queue is not None:
                raise Failure(f"--queue comes from the app's declaration of {kind!r} when --app is given; drop it")
            loaded = load_app(app_spec)
            job_kind = loaded.kind(kind)
            limit = loaded.queues[job_kind.queue].max_length
            bounds = {job_kind.queue: limit} if limit is not None else None  # a bounded queue: tried once
        else:
            job_kind = _undeclared_kind(kind, queue, max_attempts)
            bounds = None
        opts = EnqueueOptions(delay=delay, priority=priority, unique_key=unique_key)
        store = open_backend(backend)
        if backend.partition("://")[0] == "memory":
            raise Failure(
                "memory:// keeps jobs inside one process, so a job enqueued here would vanish when this "
                "command exits; give the workers' backend (sqlite:///... or postgresql://...)"
            )

        async def insert() -> tuple[int, bool, str | None]:
            await store.open()
            try:
                new = job_kind.new_job(args, opts, store.now(), store.wall_offset())
                if max_attempts is not None:
                    new = new._replace(max_attempts=max_attempts)
                [(job_id, existing)] = await store.insert_many([new], bounds) if bounds else await store.insert_many([new])
                return job_id, existing, new.unique_key
            finally:
                await store.close()

        job_id, existing, key = run_trio(insert)
    except (ConfigError, ArgsError, UnknownJob) as exc:
        raise Failure(redact(str(exc), backend)) from None
    except NurseryJobsError as exc:
        raise RunFailure(redact(str(exc), backend)) from None
    click.echo(job_id)
    if existing:
        # The kind's own `unique` function may have made the key: name the one the job holds.
        click.echo(f"nursery-jobs enqueue: job {job_id} holds unique key {key!r} and is not final; nothing was added", err=True)
    return 0


def _undeclared_kind(name: str, queue: str | None, max_attempts: int | None) -> JobKind[Any, Any]:
    """A kind known only by name: an app declaring just it, on `queue`, taking any arguments,
    so the name, queue and attempts are checked by the app's own rules."""
    from ..app import App
    from ..config import DEFAULT_QUEUE

    app = App()
    on = DEFAULT_QUEUE if queue is None else queue
    if on != DEFAULT_QUEUE:
        app.queue(on, max_workers=1)
    return app.job(queue=on, name=name, max_attempts=25 if max_attempts is None else max_attempts)(_any_args)


async def _any_args(ctx: JobContext, **args: Any) -> None:
    """Never runs: the worker runs the kind its own app declares."""


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
    from ..backends.postgres.schema import migrate as apply_migrations
    from ..backends.postgres.url import parse_postgres_url
    from ..infra.pg import psycopg

    url = database_url
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme == "sqlite":
        # Not a mistake to refuse: one deploy script may migrate whichever backend it is given.
        click.echo("nothing to migrate: an SQLite database creates and upgrades its own schema when a runtime "
                   "opens it; `nursery-jobs migrate` is for PostgreSQL")  # fmt: skip
        return
    if scheme not in ("", "postgresql", "postgres"):
        raise Failure(
            f"migrate is for PostgreSQL (--database-url postgresql://user@host/db), not {redact(scheme, url)}://"
            + ("; the memory backend has no schema to create" if scheme == "memory" else "")
        )
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
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()  # the bare command: its help is the answer
        return exc.exit_code
    except click.UsageError as exc:
        # click's own answer is four lines (usage, a hint, a blank, the error): one line, as
        # every other mistake gets.
        path = exc.ctx.command_path if exc.ctx is not None else "nursery-jobs"
        sentences = " ".join(exc.format_message().split()).rstrip(".").split(". ")
        text = "; ".join(f"{t[:1].lower()}{t[1:]}" for t in sentences)
        click.echo(f"{path}: {text} (see '{path} --help')", err=True)
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo("nursery-jobs: aborted", err=True)
        return 1
    return result if isinstance(result, int) else 0
