"""`MODULE:APP` to the `App` it names, or one line saying what could not be found.

MODULE is a dotted module name (``myservice.jobs``), looked up in the current directory first
and then in the installed packages, as ``python -m`` would; or a path to a Python file
(``examples/service_jobs.py``), whose own folder is searched for its imports, as ``python
path.py`` would. APP is an attribute of that module, dotted if need be (``:jobs.app``), and
defaults to ``app``.

What the user named and is not there -- the module, the file, the attribute -- is a `Failure`:
one line, exit code 2. A module that is found but fails while it is imported is a bug in that
module, and its traceback is the only useful report, so that error is left to propagate; only a
missing import inside it (a dependency not installed) is shortened to one line, since its
traceback says nothing the line does not.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType

from ..app import App
from .failure import Failure

__all__ = ["load_app"]


def load_app(spec: str) -> App:
    """The `App` that `spec` (``MODULE:APP``, APP defaulting to ``app``) names."""
    module_name, _, attr = spec.partition(":")
    attr = attr or "app"
    if not module_name:
        raise Failure(f"{spec!r} names no module; give MODULE:APP, e.g. myservice.jobs:app")
    if module_name.endswith(".py") or os.sep in module_name or "/" in module_name:
        module = _import_file(module_name)
    else:
        module = _import_module(module_name)
    found: object = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            apps = sorted(name for name, value in vars(module).items() if isinstance(value, App))
            hint = f"; the App objects in it: {', '.join(apps)}" if apps else "; it defines no nursery_jobs.App"
            raise Failure(f"module {module.__name__!r} has no attribute {attr!r}{hint}") from None
    if not isinstance(found, App):
        raise Failure(f"{module_name}:{attr} is not an nursery_jobs.App (its type is {type(found).__name__})")
    return found


def _import_module(name: str) -> ModuleType:
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if name == missing or name.startswith(missing + "."):
            raise Failure(
                f"no module named {missing!r} (looked in {os.getcwd()} and the installed packages); "
                "give a dotted module name or a path to a .py file"
            ) from None
        raise Failure(f"importing {name!r} failed: {exc} ({_where(exc)}); is it installed here?") from None
    except ImportError as exc:
        raise Failure(f"importing {name!r} failed: {exc} ({_where(exc)})") from None


def _import_file(path: str) -> ModuleType:
    file = Path(path)
    if not file.is_file():
        raise Failure(f"no file {path!r} (from {os.getcwd()})")
    name = file.stem
    if not name.isidentifier():
        raise Failure(f"the file name {file.name!r} cannot be a module name; rename it (letters, digits, _)")
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise Failure(f"{path!r} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    folder = str(file.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    sys.modules[name] = module  # as an import would: pickling and the module's own imports find it
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        del sys.modules[name]
        raise Failure(f"importing {path!r} failed: {exc} ({_where(exc)})") from None
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _where(exc: BaseException) -> str:
    """The file and line of the import statement that failed (the last frame outside importlib)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename]
    if not frames:
        return "while importing"
    last = frames[-1]
    return f"{last.filename}, line {last.lineno}"
