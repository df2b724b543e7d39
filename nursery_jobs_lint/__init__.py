"""nursery_jobs_lint: the bare-spawn lint. Only the allowed (infra) paths may start concurrent work.

The problem
-----------
nursery_jobs promises that no task escapes its scope: every job, child task, offloaded thread
and bridged asyncio task lives under a nursery the runtime owns, so shutdown can stop it in
order, a timeout can cancel it, and the property suites can account for it. One
``nursery.start_soon`` in job code, one ``threading.Thread``, one ``atexit.register`` breaks that
promise silently: the code works, the tests pass, and the task outlives its job in production.
The design's rule is therefore "only ``nursery_jobs/infra/`` spawns"; this package turns
the rule into a gate.

The naive approach, and why it fails
------------------------------------
Code review catches the obvious ``open_nursery``; it does not catch ``from trio import lowlevel
as ll``, ``getattr(n, "start_soon")``, ``loop.call_later``, a ``socketserver.ThreadingMixIn``
base class, or ``to_thread.run_sync(..., abandon_on_cancel=True)`` in infra itself. Existing
tools cover slices: flake8-async has no location-based ban, import-linter cannot see methods or
keywords, ruff's banned-api cannot see receivers or reflection, and all of them honour
``# noqa``.

The design, module by module
----------------------------
* :mod:`.rules` -- the catalogue: codes NJS001-NJS205 and opt-in NJS901, their explanations, and
  the qualified-name and method-name tables.
* :mod:`.config` -- ``[tool.nursery_jobs.lint]``: strict validation (unknown keys, bad globs and
  regexes are errors), gitignore-like globs, the include/allow/tests classification.
* :mod:`.scopes` -- per-scope (LEGB) binding tables that keep every candidate of a name, alias
  and relative-import resolution, receiver kinds (nursery / executor / portal).
* :mod:`.checker` -- :func:`check_source`, the one function the CLI and the flake8 plugin share;
  suppression attempts are themselves findings (NJS002).
* :mod:`.firstparty` -- full mode follows first-party re-exports, so infra may export wrappers
  but not raw primitives.
* :mod:`.discovery` -- git's file list (full mode) or the given paths (file mode).
* :mod:`.cli` -- exit codes 0/1/2, output formats, ``--explain``, ``--self-test``.
* :mod:`.flake8_plugin` -- advisory editor integration (flake8 honours ``# noqa``; the CLI does
  not, which is why the CLI is the gate).

What was left out
-----------------
Anything dynamic: a nursery passed through an untyped parameter or a container, code built from
strings, threads started inside third-party libraries. The runtime's task audit in the property
suites is the backstop for those. No third-party imports: this package uses only the standard
library (Python 3.11+, ``tomllib``), so hooks start fast and never import trio or psycopg.
"""

from __future__ import annotations

__version__ = "0.1.0.dev0"

from .checker import Finding, check_source
from .config import Config, ConfigError, load_config
from .rules import RULES, Rule

__all__ = ["Config", "ConfigError", "Finding", "RULES", "Rule", "check_source", "load_config", "__version__"]
