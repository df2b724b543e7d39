"""The rule catalogue: every code, what it names, and the tables the checker matches against.

The problem
-----------
A job runtime that promises "no task escapes its scope" is only as good as the places that can
start tasks. In Trio that is a short list (``open_nursery`` and ``.start_soon``/``.start``), but a
Python process has many more doors: ``trio.lowlevel.spawn_system_task``, threads abandoned by
``to_thread.run_sync(abandon_on_cancel=True)``, asyncio tasks, ``threading``,
``multiprocessing``, ``os.fork``, signal handlers, ``atexit`` callbacks, and stdlib servers that
start a thread per request. Any one of them, used in job code, produces activity that the runtime
cannot cancel, wait for or account for.

The naive approach, and why it fails
------------------------------------
"Grep for ``start_soon`` and ``open_nursery``" misses every door but two, and fires on comments
and strings. A name blocklist (``Thread``, ``fork``) fires on innocent user names and misses
``import threading as t``. A single giant list with one code makes messages useless: the fix for
a ``signal.signal`` handler (move it into infra's signal service) is not the fix for a
``to_thread.run_sync`` call (use ``nursery_jobs.run_blocking``).

What this module does
---------------------
It is data, not logic. Each door is written down once, as a fully qualified name or a method
name, under the code whose message says what to do instead:

* ``RULES``: code -> :class:`Rule` (name, one-line summary, example that fires, the long
  ``--explain`` text, whether the rule is opt-in, whether it also applies inside ``allow``).
* Qualified-name tables (``NURSERY_FACTORIES``, ``LOWLEVEL_ALLOWED``, ``PROCESS_SPAWNERS`` ...),
  matched by the checker against *resolved* names, so ``import trio as t; t.open_nursery()``
  and ``from trio import open_nursery as o; o()`` both reach ``trio.open_nursery``.
* Method-name tables for spawns that have no importable name (``nursery.start_soon``,
  ``loop.call_later``): ``DISTINCTIVE_SPAWN_ATTRS`` fire on any receiver because the name alone
  gives the game away; ``GATED_SPAWN_ATTRS`` (``start``, ``submit``, ``map``, ``start_task``) are
  common words and fire only when the receiver is known to be a nursery, executor or portal.

Matching uses a dotted-prefix rule: a table entry ``trio.Nursery`` also matches
``trio.Nursery.start_soon`` (an unbound method is still the raw type), but never
``trio.NurseryManager``. Configured ``extend-banned-names`` are the exception: they match exactly,
as the specification says.

What was left out
-----------------
No severity levels and no per-rule disable switch: every rule here is a hole in the runtime's
guarantee, so the only knob is ``extend-select`` for opt-in rules (NJS901) that are too noisy to
be on by default. No "fix" suggestions that rewrite code: the fix is architectural (go through
infra), and a message that names the right door is worth more than an autofix that picks the
wrong one.
"""

from __future__ import annotations

import dataclasses
import functools
import re

__all__ = [
    "Rule",
    "RULES",
    "ALWAYS_IN_ALLOW",
    "OPT_IN",
    "DEFAULT_BANNED_MODULES",
    "DISTINCTIVE_SPAWN_ATTRS",
    "GATED_SPAWN_ATTRS",
    "qualified_matches",
    "dotted_match",
]


@dataclasses.dataclass(frozen=True)
class Rule:
    """One lint code.

    ``applies_in_allow`` marks the two runtime invariants (NJS001, NJS104) that hold even inside
    the allowed infra paths; ``opt_in`` marks rules that run only when listed in
    ``extend-select``.
    """

    code: str
    name: str
    summary: str
    example: str
    explain: str
    opt_in: bool = False
    applies_in_allow: bool = False


def _rule(code: str, name: str, summary: str, example: str, explain: str, **kw: bool) -> Rule:
    return Rule(code, name, summary, example, explain.strip("\n"), **kw)


_ASK_INFRA = (
    "Only the allowed paths (by default nursery_jobs/infra/**) own tasks. Job code enqueues a "
    "job, declares a periodic, or asks infra for a scope; infra code is reviewed by its owners."
)

RULES: dict[str, Rule] = {
    r.code: r
    for r in [
        _rule(
            "NJS001",
            "unparsable-file",
            "the file could not be parsed or decoded, so it could not be judged",
            "def f(:",
            """
Fires when a checked file is not valid Python for this interpreter: a SyntaxError, an invalid
encoding cookie, undecodable bytes, NUL bytes, or nesting too deep to analyse.

Why: a file the lint cannot read is a file the lint cannot vouch for. Passing it silently would
let any spawn hide behind one syntax error. This rule also applies inside `allow` paths.

Does not fire on: valid files, whatever they contain.

Instead: fix the syntax or the encoding. If the file is deliberately not Python (a template,
a fixture with broken syntax), move it out of `include` or into `tests`.
""",
            applies_in_allow=True,
        ),
        _rule(
            "NJS002",
            "suppression-not-allowed",
            "an inline suppression comment tried to silence the lint",
            "n.start_soon(f)  # noqa: NJS102",
            """
Fires on any comment that would suppress this lint somewhere: `# noqa: NJS...` (any NJS code or
prefix, any spelling), a bare `# noqa` on a line (or multi-line string range) that has an NJS
finding, `# flake8: noqa` / `# ruff: noqa` in a file with an NJS finding or naming NJS codes,
and any `# nursery-jobs-lint: ...` directive.

Why: the lint has no inline suppression and no per-file ignores by design. flake8 honours
`# noqa`, so the advisory flake8 plugin could be silenced in an editor; this rule makes the
attempt itself fail in the gate (the CLI) instead of silently doing nothing.

Does not fire on: `# noqa` comments that name only other tools' codes (`# noqa: E501`) on lines
without NJS findings; `# type: ignore`.

Instead: fix the code, or move it into an allowed path (nursery_jobs/infra/**), where the owners
review it.
""",
        ),
        _rule(
            "NJS003",
            "dynamic-import-of-banned-module",
            "a banned module is imported by name at run time",
            'importlib.import_module("threading")',
            """
Fires on `importlib.import_module("<name>")` and `__import__("<name>")` with a constant string
naming a banned concurrency module (asyncio, threading, _thread, multiprocessing, concurrent,
trio_asyncio, gevent, eventlet, greenlet, plus `extend-banned-modules`), including submodules.

Why: a dynamic import is the first step of hiding `threading.Thread` from a static checker.

Does not fire on: dynamic imports of other modules, or with a non-constant name (the lint
cannot know it; the runtime audit is the backstop).

Instead: do not import concurrency modules outside infra. Use what the runtime offers (jobs,
`nursery_jobs.run_blocking`, infra's asyncio bridge).
""",
        ),
        _rule(
            "NJS004",
            "reflective-spawn-access",
            "a spawn primitive is reached through getattr or operator instead of by name",
            'getattr(n, "start_soon")(job)',
            """
Fires on reflective access that reaches a spawn: `getattr(x, "start_soon")` (any distinctive
spawn method; `"start"`/`"submit"`/`"map"`/`"start_task"` when `x` is a nursery, executor or
portal), `getattr(trio.lowlevel, "spawn_system_task")` (any constant that resolves to a flagged
name), `operator.attrgetter("start_soon")`, `operator.methodcaller("create_task", coro)`,
`x.__getattribute__("start_soon")`, and `getattr(<watched module or nursery>, <non-constant>)`,
where watched modules are trio, anyio, os, signal, subprocess, the banned modules and the other
modules this lint knows spawn doors in.

Why: reflection is the obvious way around an attribute check.

Does not fire on: `getattr(obj, "name")` for ordinary attributes, `getattr(config, key)` on
objects that are not watched modules or nurseries.

Instead: there is no reflective way to spawn outside infra either; ask infra for a scope.
""",
        ),
        _rule(
            "NJS005",
            "star-import-from-watched-module",
            "a star import from a module the lint watches hides which names are bound",
            "from trio.lowlevel import *",
            """
Fires on `from M import *` where M is trio or any trio submodule, anyio or its submodules, os,
signal, subprocess, any banned module, or any other module whose names this lint tracks (pty,
atexit, weakref, faulthandler, sys, socketserver, http.server, logging.handlers, logging.config,
importlib, operator, builtins, inspect, posix, trio_parallel).

Why: after `from trio.lowlevel import *`, `spawn_system_task(f)` is a bare name whose origin the
lint cannot see.

Does not fire on: star imports from other modules (including first-party ones).

Instead: import the names you need explicitly.
""",
        ),
        _rule(
            "NJS101",
            "nursery-opened",
            "a nursery or task group is created outside infra",
            "async with trio.open_nursery() as n:",
            f"""
Fires on any reference (call, alias, import) to `trio.open_nursery`, `anyio.create_task_group`
or `asyncio.TaskGroup`, however they were imported or aliased.

Why: a nursery owns tasks. A nursery opened in job code is a set of tasks the runtime does not
know about: shutdown cannot stop them in order, the property suites cannot attribute them, and
a job's timeout cancels them without the runtime recording why. {_ASK_INFRA}

Does not fire on: `trio.CancelScope`, `trio.fail_after`, `trio.move_on_after/at`, `trio.Event`,
channels, `trio.CapacityLimiter` (none of them start tasks).

Instead: split the work into jobs (enqueue them), or use the scope that infra gives a job
(ask nursery_jobs.infra.owner for a scope; job code spawns children through it).
""",
        ),
        _rule(
            "NJS102",
            "spawn-method",
            "a task, callback or thread is started through a spawn method",
            "self._nursery.start_soon(worker)",
            f"""
Fires on any load of a distinctive spawn attribute, on any receiver: `start_soon`,
`create_task`, `run_in_executor`, `call_soon`, `call_soon_threadsafe`, `call_later`, `call_at`,
`run_sync_soon`, `start_task_soon`, `start_new_thread`, `apply_async`, `map_async`,
`starmap_async`. Also on receiver-gated attributes when the receiver is known to be of the right
kind: `.start` on a nursery-like receiver, `.start_task` on a portal, `.submit`/`.map` on an
executor. A receiver is nursery-like when it was bound by `async with trio.open_nursery() as n`
(or `anyio.create_task_group()`, `asyncio.TaskGroup()`), by `x = await
stack.enter_async_context(<factory>())` or `x = <factory>()`, by an annotation naming the raw
type (`Optional[...]`, `X | None` and string annotations included), by a `self.<attr>` that any
method assigns from such a value or the class body annotates, or when its last identifier matches
`nursery-name-regex` (default `(?i)(^|_)(nursery|task_?group|tg)$`). Calls are not needed: a
`functools.partial(n.start_soon, f)` is a spawn too. {_ASK_INFRA}

Does not fire on: `server.start()` or `thread_like.start()` on receivers of unknown kind, the
runtime's own `spawn(...)` method on the infra-owned scope, `rt.enqueue(...)`.

Instead: ask nursery_jobs.infra.owner for a scope and spawn children through it; for blocking
work call nursery_jobs.run_blocking(fn).
""",
        ),
        _rule(
            "NJS103",
            "trio-lowlevel",
            "a trio.lowlevel escape hatch (or a private trio module) is used outside infra",
            "trio.lowlevel.spawn_system_task(heartbeat)",
            """
Fires on any `trio.lowlevel.X` except the read-only allowlist: `checkpoint`,
`checkpoint_if_cancelled`, `cancel_shielded_checkpoint`, `current_task`, `current_root_task`,
`current_statistics`, `current_clock`, `in_trio_run`, `in_trio_task`, `Task`. This covers
`spawn_system_task`, `start_guest_run`, `start_thread_soon`, `open_process`,
`*_detach_coroutine_object`, `current_trio_token` and every other escape hatch. References to
trio's private modules (`trio._core...`, `trio._threads...`) fire too, because they reach the
same functions by another name.

Why: system tasks live outside every user nursery (they survive the job that started them),
guest runs and thread-soon callbacks run outside Trio's task tree, and a TrioToken lets any
thread schedule work back into the loop.

Does not fire on: the allowlisted read-only helpers above.

Instead: ask nursery_jobs.infra.owner for a scope; background services belong in infra.
""",
        ),
        _rule(
            "NJS104",
            "abandoned-thread",
            "a thread offload may be abandoned on cancel",
            "await trio.to_thread.run_sync(f, abandon_on_cancel=True)",
            """
Fires on `trio.to_thread.run_sync` / `anyio.to_thread.run_sync` (called directly or wrapped in
`functools.partial`) with `abandon_on_cancel=` or the legacy `cancellable=` set to anything other
than the literal `False`, or with a `**kwargs` unpacking the lint cannot see into. This rule also
applies inside `allow` paths.

Why: an abandoned thread keeps running after its caller was cancelled. Nobody waits for it,
nobody sees its errors, and it can outlive the runtime. The runtime promises that no thread
is abandoned on cancel, in infra as much as anywhere.

Does not fire on: `abandon_on_cancel=False`, or no such keyword.

Instead: leave the keyword out (the default is False), or use nursery_jobs.run_blocking(fn),
which never abandons its thread and counts it toward the runtime's limiter.
""",
            applies_in_allow=True,
        ),
        _rule(
            "NJS105",
            "offload-outside-runtime",
            "work is offloaded to a thread or process outside infra",
            "await trio.to_thread.run_sync(blocking_io)",
            """
Fires on `trio.to_thread.run_sync`, anything in `anyio.to_thread` and `anyio.to_process`, and
anything in `trio_parallel`.

Why: an offloaded call runs on a thread or process the runtime does not count. The runtime's
limiter (property P05) bounds offloaded threads only if every offload goes through it.

Does not fire on: `trio.to_thread.current_default_thread_limiter()` (a read).

Instead: call nursery_jobs.run_blocking(fn), which runs the call on a thread under the runtime's
limiter and never abandons it.
""",
        ),
        _rule(
            "NJS106",
            "loop-or-bridge",
            "an event loop is started, or a thread bridges into one, outside infra",
            "trio.run(main)",
            """
Fires on `trio.run`, `anyio.run`, and anything in `trio.from_thread` or `anyio.from_thread`
(`run`, `run_sync`, `start_blocking_portal`, `BlockingPortal`, ...).

Why: a second event loop is a second task tree the runtime does not own; a thread calling back
into Trio runs code the runtime cannot cancel. `nursery_jobs.run()` itself calls an infra helper
that does the `trio.run`, so `allow` stays exactly "infra/ packages".

Does not fire on: `trio.run_process`, `trio.open_signal_receiver` (structured, awaited).

Instead: a service's entry point is nursery_jobs.run(main, app=app, main_grace=seconds). A web
server runs inside main, handed shutdown_trigger=rt.shutdown_requested.wait: at SIGTERM it
drains its requests within main_grace while the runtime still serves them, then the jobs get
their grace (nursery_jobs' docs/shutdown.md, "Web services that drain"). A server started
beside open_runtime under a trio.run of its own is a task tree the shutdown does not reach. For
a thread bridging into the loop: run the work as a job, or through infra's bridge.
""",
        ),
        _rule(
            "NJS107",
            "raw-nursery-type",
            "a raw nursery or task-group type is named outside infra",
            "def register(n: trio.Nursery): ...",
            """
Fires on any reference to `trio.Nursery`, `anyio.abc.TaskGroup` or `asyncio.TaskGroup` outside
infra: annotations (including string annotations and TYPE_CHECKING imports), isinstance checks,
casts.

Why: a function that accepts a raw nursery is the door through which raw nurseries leak into
job code. Blocking the type makes the untyped route the only one left, and that route is what
NJS901 and the runtime audit are for.

Does not fire on: `task_status: trio.TaskStatus` in startable functions, `trio.CancelScope`.

Instead: accept the scope object that infra hands out (ask nursery_jobs.infra.owner for a
scope) instead of a raw nursery.
""",
        ),
        _rule(
            "NJS201",
            "banned-module-import",
            "a banned concurrency module is imported outside infra",
            "from concurrent.futures import ThreadPoolExecutor",
            """
Fires on `import M`, `import M.sub`, `from M import x` and `from M.sub import x` where M is a
banned module: asyncio, threading, _thread, multiprocessing, concurrent, trio_asyncio, gevent,
eventlet, greenlet, plus `extend-banned-modules`. A module matches itself and all of its
submodules. In full mode it also fires when a first-party module re-exports a banned name
(`from nursery_jobs.infra.x import Thread` where infra's x did `from threading import Thread`):
infra may export wrappers, not raw primitives.

Imports inside `if TYPE_CHECKING:` do not fire (they never run), but the names they bind are
still tracked, so a runtime use of them fires NJS202.

Why: each of these modules is a whole second concurrency system (threads, processes, asyncio
tasks, greenlets) that the Trio runtime cannot cancel or account for.

Does not fire on: anyio as a whole (only its spawning and bridging APIs are banned, see NJS101,
NJS105, NJS106, NJS107, NJS203), first-party modules, trio.

Instead: use the runtime (jobs, nursery_jobs.run_blocking, infra's asyncio bridge).
""",
        ),
        _rule(
            "NJS202",
            "banned-module-use",
            "a name from a banned module (or a configured banned name) is used outside infra",
            "class W(threading.Thread): ...",
            """
Fires on every reference into a banned module outside annotations: calls, base classes,
decorators, default values, `partial(...)` arguments, plain aliases. Also fires on every
reference to a name listed in `extend-banned-names`, with the configured message.

Double reporting is intentional: the import gets NJS201 and each use gets NJS202, so every line
that must change is listed. References that occur only in annotations do not fire NJS202 (pair
them with an import under TYPE_CHECKING).

Why: see NJS201.

Instead: use the runtime (jobs, nursery_jobs.run_blocking, infra's asyncio bridge); for a
configured name, follow its message.
""",
        ),
        _rule(
            "NJS203",
            "process-spawn",
            "a child process is started in a way nobody awaits",
            'sp.Popen(["worker"])',
            """
Fires on `subprocess.Popen`, `os.fork`, `os.forkpty`, `os.posix_spawn`, `os.posix_spawnp`,
`os.spawn*`, `os.popen`, `os.register_at_fork`, `pty.fork`, `pty.spawn`, `anyio.open_process`
(and the same functions reached through `posix` / `_posixsubprocess`).

Why: a Popen object or a forked child lives on after the job that made it; nothing reaps it on
cancel.

Does not fire on: `await trio.run_process([...])` (structured: awaited and killed on cancel),
`subprocess.run([...], check=True)` (blocking; flake8-async's ASYNC221 covers it inside async
functions).

Instead: `await trio.run_process([...])` inside a job, or nursery_jobs.run_blocking for a
blocking call.
""",
        ),
        _rule(
            "NJS204",
            "out-of-scope-callback",
            "a callback is registered that runs outside any scope",
            "atexit.register(flush)",
            """
Fires on `signal.signal`, `signal.setitimer`, `signal.alarm`, `signal.set_wakeup_fd`,
`atexit.register`, `weakref.finalize`, `faulthandler.dump_traceback_later`,
`sys.set_asyncgen_hooks`, also as decorators (`@atexit.register`).

Why: these callbacks run at an arbitrary moment, outside every cancel scope, after the runtime
may already be gone.

Does not fire on: `with trio.open_signal_receiver(signal.SIGTERM)` (structured), `signal.SIGTERM`
and other constants.

Instead: signals are mapped to the shutdown sequence by infra (nursery_jobs.infra.signals);
cleanup belongs in a `finally` or an `async with` under the runtime.
""",
        ),
        _rule(
            "NJS205",
            "hidden-thread-spawner",
            "a stdlib API that starts threads or processes internally is used outside infra",
            "QueueListener(q, h).start()",
            """
Fires on `socketserver.Threading*` and `socketserver.Forking*` (mixins and servers),
`http.server.ThreadingHTTPServer`, `logging.handlers.QueueListener`, `logging.config.listen`.

Why: these start a thread (or fork a process) per request or for their lifetime, out of sight.

Does not fire on: the non-threading servers, `logging.handlers.QueueHandler`.

Instead: serve with Trio (trio.serve_tcp) inside infra, or log synchronously.
""",
        ),
        _rule(
            "NJS901",
            "untyped-awaited-start",
            "opt-in: `await x.start(f, ...)` on a receiver of unknown type",
            "async def f(x): await x.start(serve)",
            """
Opt-in (`extend-select = ["NJS901"]`). Fires on `await <expr>.start(<positional>, ...)` when the
receiver is not known to be a nursery and carries no annotation: a possible `nursery.start`
hidden behind an untyped parameter or container.

Why: NJS102 fires on `.start` only when the receiver is known to be nursery-like, because
`server.start()` is common. This rule closes part of that gap at the price of false positives.

Does not fire on: receivers with an annotation (`srv: Server`), sync `.start()` calls, `.start()`
without positional arguments.

Instead: annotate the receiver with its real type (which also lets NJS107 see raw nurseries), or
go through infra.
""",
            opt_in=True,
        ),
    ]
}

OPT_IN = frozenset(code for code, rule in RULES.items() if rule.opt_in)
ALWAYS_IN_ALLOW = frozenset(code for code, rule in RULES.items() if rule.applies_in_allow)

# --- Modules -------------------------------------------------------------------------------

# Whole-module bans (decision 3). anyio is deliberately absent: only its spawning and bridging
# APIs are banned, in the qualified tables below, so its files and paths stay usable.
DEFAULT_BANNED_MODULES: tuple[str, ...] = (
    "asyncio",
    "threading",
    "_thread",
    "multiprocessing",
    "concurrent",
    "trio_asyncio",
    "gevent",
    "eventlet",
    "greenlet",
)

# Star imports from these (and from banned modules) hide names the tables below look for.
WATCHED_MODULES: tuple[str, ...] = (
    "trio",
    "anyio",
    "os",
    "posix",
    "signal",
    "subprocess",
    "_posixsubprocess",
    "pty",
    "atexit",
    "weakref",
    "faulthandler",
    "sys",
    "socketserver",
    "http.server",
    "logging.handlers",
    "logging.config",
    "importlib",
    "operator",
    "builtins",
    "inspect",
    "trio_parallel",
)

# --- Attributes (NJS102) -------------------------------------------------------------------

DISTINCTIVE_SPAWN_ATTRS = frozenset(
    {
        "start_soon",
        "create_task",
        "run_in_executor",
        "call_soon",
        "call_soon_threadsafe",
        "call_later",
        "call_at",
        "run_sync_soon",
        "start_task_soon",
        "start_new_thread",
        "apply_async",
        "map_async",
        "starmap_async",
    }
)

# attribute -> receiver kind that makes it a spawn
GATED_SPAWN_ATTRS: dict[str, str] = {
    "start": "nursery",
    "start_task": "portal",
    "submit": "executor",
    "map": "executor",
}

# --- Receiver kinds ------------------------------------------------------------------------

NURSERY_FACTORIES = frozenset({"trio.open_nursery", "anyio.create_task_group", "asyncio.TaskGroup"})
NURSERY_TYPES = frozenset({"trio.Nursery", "anyio.abc.TaskGroup", "asyncio.TaskGroup"})
EXECUTOR_FACTORIES = frozenset(
    {
        "concurrent.futures.ThreadPoolExecutor",
        "concurrent.futures.ProcessPoolExecutor",
        "concurrent.futures.InterpreterPoolExecutor",
        "concurrent.futures.thread.ThreadPoolExecutor",
        "concurrent.futures.process.ProcessPoolExecutor",
        "multiprocessing.Pool",
        "multiprocessing.pool.Pool",
        "multiprocessing.pool.ThreadPool",
        "multiprocessing.dummy.Pool",
    }
)
EXECUTOR_TYPES = EXECUTOR_FACTORIES | {"concurrent.futures.Executor", "concurrent.futures._base.Executor"}
PORTAL_FACTORIES = frozenset({"anyio.from_thread.start_blocking_portal", "anyio.from_thread.BlockingPortal"})
PORTAL_TYPES = frozenset({"anyio.from_thread.BlockingPortal"})

FACTORIES_BY_KIND = {"nursery": NURSERY_FACTORIES, "executor": EXECUTOR_FACTORIES, "portal": PORTAL_FACTORIES}
TYPES_BY_KIND = {"nursery": NURSERY_TYPES, "executor": EXECUTOR_TYPES, "portal": PORTAL_TYPES}

# --- Qualified names -----------------------------------------------------------------------

LOWLEVEL_ALLOWED = frozenset(
    {
        "checkpoint",
        "checkpoint_if_cancelled",
        "cancel_shielded_checkpoint",
        "current_task",
        "current_root_task",
        "current_statistics",
        "current_clock",
        "in_trio_run",
        "in_trio_task",
        "Task",
    }
)

OFFLOAD_NAMES = ("trio.to_thread.run_sync",)
OFFLOAD_MODULES = ("anyio.to_thread", "anyio.to_process", "trio_parallel")
THREAD_RUN_SYNC = frozenset({"trio.to_thread.run_sync", "anyio.to_thread.run_sync"})
ABANDON_KEYWORDS = ("abandon_on_cancel", "cancellable")

LOOP_NAMES = ("trio.run", "anyio.run")
BRIDGE_MODULES = ("trio.from_thread", "anyio.from_thread")

PROCESS_SPAWNERS = (
    "subprocess.Popen",
    "os.fork",
    "os.forkpty",
    "os.posix_spawn",
    "os.posix_spawnp",
    "os.popen",
    "os.register_at_fork",
    "posix.fork",
    "posix.forkpty",
    "posix.posix_spawn",
    "posix.posix_spawnp",
    "posix.register_at_fork",
    "_posixsubprocess.fork_exec",
    "pty.fork",
    "pty.spawn",
    "anyio.open_process",
)
_OS_SPAWN_RE = re.compile(r"^(os|posix)\.spawn[lv]p?e?(\.|$)")

OUT_OF_SCOPE_CALLBACKS = (
    "signal.signal",
    "signal.setitimer",
    "signal.alarm",
    "signal.set_wakeup_fd",
    "atexit.register",
    "weakref.finalize",
    "faulthandler.dump_traceback_later",
    "sys.set_asyncgen_hooks",
)

HIDDEN_SPAWNERS = (
    "http.server.ThreadingHTTPServer",
    "logging.handlers.QueueListener",
    "logging.config.listen",
)
_SOCKETSERVER_RE = re.compile(r"^socketserver\.(Threading|Forking)[A-Za-z]*(\.|$)")

# Reflection helpers (NJS003/NJS004), matched against resolved call targets.
IMPORT_FUNCTIONS = frozenset({"importlib.import_module", "__import__", "builtins.__import__"})
GETATTR_FUNCTIONS = frozenset({"getattr", "builtins.getattr", "inspect.getattr_static"})
ATTRGETTER_FUNCTIONS = frozenset({"operator.attrgetter", "operator.methodcaller"})
PARTIAL_FUNCTIONS = frozenset({"functools.partial", "functools.partialmethod"})
ENTER_CONTEXT_ATTRS = frozenset({"enter_async_context", "enter_context"})


def dotted_match(name: str, entry: str) -> bool:
    """True if ``name`` is ``entry`` or something inside it (``entry.x``), never ``entryx``."""
    return name == entry or name.startswith(entry + ".")


def _any_match(name: str, entries: tuple[str, ...] | frozenset[str]) -> str | None:
    for entry in entries:
        if dotted_match(name, entry):
            return entry
    return None


@functools.lru_cache(maxsize=1 << 16)
def qualified_matches(name: str, banned_modules: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Return ``[(code, detail)]`` for a fully qualified name, in code order.

    ``detail`` is the matched name, except for NJS202 where it is the banned module. NJS202 is
    included for banned modules; callers drop it in annotations and at import sites, where
    NJS201 speaks instead. Configured ``extend-banned-names`` are matched by the caller, exactly.
    """
    found: list[tuple[str, str]] = []
    if _any_match(name, NURSERY_FACTORIES):
        found.append(("NJS101", name))
    if name.startswith("trio.lowlevel."):
        member = name.split(".")[2]
        if member not in LOWLEVEL_ALLOWED:
            found.append(("NJS103", name))
    elif re.match(r"^trio\._(?!_)", name):
        found.append(("NJS103", name))
    if _any_match(name, OFFLOAD_NAMES) or any(name.startswith(m + ".") for m in OFFLOAD_MODULES):
        found.append(("NJS105", name))
    if _any_match(name, LOOP_NAMES) or any(name.startswith(m + ".") for m in BRIDGE_MODULES):
        found.append(("NJS106", name))
    if _any_match(name, NURSERY_TYPES):
        found.append(("NJS107", name))
    module = _any_match(name, banned_modules)
    if module is not None:
        found.append(("NJS202", module))
    if _any_match(name, PROCESS_SPAWNERS) or _OS_SPAWN_RE.match(name):
        found.append(("NJS203", name))
    if _any_match(name, OUT_OF_SCOPE_CALLBACKS):
        found.append(("NJS204", name))
    if _any_match(name, HIDDEN_SPAWNERS) or _SOCKETSERVER_RE.match(name):
        found.append(("NJS205", name))
    return tuple(found)
