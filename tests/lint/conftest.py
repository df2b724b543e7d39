"""pytest fixtures for the lint's tests; the helpers live in lint_support.py."""

from .lint_support import lint_env, lint_import_dir, make_project, run_cli  # noqa: F401
