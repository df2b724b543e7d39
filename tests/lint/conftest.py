"""pytest fixtures for the lint's tests; the helpers live in lint_support.py.

Importing lint_support first makes ``nursery_jobs_lint`` resolve to this checkout's ``lint/``
folder, whatever is installed.
"""

import pathlib
import sys

# robust under --import-mode=importlib too, which does not put this folder on sys.path
_HERE = str(pathlib.Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from lint_support import lint_env, lint_shim_dir, make_project, run_cli  # noqa: E402, F401
