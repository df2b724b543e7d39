"""Which files a run judges: git's view in full mode, the given paths in file mode.

The problem
-----------
A gate that checks "every Python file" must agree with the repository about what "every" means.
Walking the directory tree picks up virtualenvs, build output and ignored scratch files (slow, and
a finding in ``.venv/`` is noise); checking only what git tracks misses a new file that has not
been ``git add``-ed yet, which is exactly the file a developer is about to commit.

The naive approach, and why it fails
------------------------------------
``os.walk`` + a hand-written exclude list drifts from ``.gitignore``. ``git ls-files`` alone
skips untracked files. Trusting pre-commit's file list for the whole verdict skips the
repository-level checks (stale ``allow`` entries, zero files), because a hook only sees the
files that changed.

The algorithm chosen
--------------------
* Full mode (no paths): ``git ls-files -z --cached --others --exclude-standard -- '*.py'`` run in
  the config file's directory: tracked files plus untracked-but-not-ignored ones, exactly what
  ``git add -A`` would consider. Paths come back relative to that directory. Files listed in the
  index but deleted in the work tree are skipped. Not being in a git work tree is an error (exit
  2), never a silent "0 files".
* File mode (paths given, as pre-commit does): each file as given, each directory expanded to
  its ``*.py`` files (skipping hidden directories and ``__pycache__``). Every path is made
  relative to the config directory; the caller still applies ``include``/``allow``/``tests``, so
  passing an excluded file is harmless.

What was left out
-----------------
No ``--exclude`` flag and no reading of ``.gitignore`` by hand: git is the authority. No
submodule recursion.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

__all__ = ["DiscoveryError", "git_files", "expand_paths", "relative_path"]


class DiscoveryError(Exception):
    """The set of files to judge could not be determined (exit code 2)."""


def git_files(root: pathlib.Path) -> list[str]:
    """Python files git considers part of the work tree at ``root`` (relative, ``/``-separated)."""
    command = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "*.py"]
    try:
        completed = subprocess.run(command, cwd=root, capture_output=True, check=False)
    except FileNotFoundError:
        raise DiscoveryError("full mode needs git, which is not installed; pass file paths instead") from None
    except OSError as exc:
        raise DiscoveryError(f"cannot run git in {root}: {exc}") from None
    if completed.returncode != 0:
        detail = completed.stderr.decode("utf-8", "replace").strip().splitlines()
        reason = detail[-1] if detail else f"exit code {completed.returncode}"
        raise DiscoveryError(f"full mode needs a git work tree at {root} ({reason}); pass file paths instead")
    names = sorted({name for name in completed.stdout.decode("utf-8", "surrogateescape").split("\0") if name})
    return [name for name in names if (root / name).is_file()]


def relative_path(path: pathlib.Path, root: pathlib.Path) -> str:
    """``path`` relative to ``root`` with ``/`` separators (``../...`` when outside)."""
    absolute = pathlib.Path(os.path.normpath(path if path.is_absolute() else pathlib.Path.cwd() / path))
    # resolve symlinks in the directories (the root is resolved too) but keep the file's own name
    absolute = pathlib.Path(os.path.realpath(absolute.parent)) / absolute.name
    return pathlib.Path(os.path.relpath(absolute, root)).as_posix()


def expand_paths(paths: list[str], root: pathlib.Path) -> list[str]:
    """File mode: files and expanded directories, relative to ``root``. Raises DiscoveryError
    for a path that does not exist."""
    found: set[str] = set()
    for given in paths:
        path = pathlib.Path(given)
        if path.is_dir():
            for directory, subdirs, files in os.walk(path):
                subdirs[:] = sorted(d for d in subdirs if not d.startswith(".") and d != "__pycache__")
                for name in files:
                    if name.endswith(".py"):
                        found.add(relative_path(pathlib.Path(directory, name), root))
        elif path.is_file():
            found.add(relative_path(path, root))
        else:
            raise DiscoveryError(f"no such file or directory: {given}")
    return sorted(found)
