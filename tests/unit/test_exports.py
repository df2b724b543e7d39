"""The public surface changes only on purpose (trio's test_exports, in small)."""

import re
import types
from pathlib import Path

import trio

import nursery_jobs as nj

QUICKSTART = Path(__file__).resolve().parents[2] / "docs" / "quickstart.md"

EXPECTED = {
    "App", "ArgsError", "AttemptEnd", "Backend", "BackendError", "BackendUnavailable", "BatchContext", "BatchJob",
    "BatchKind", "Cache", "CacheCheck", "CacheWaitTimeout", "CachedError", "CachedFunction", "Client", "ConfigError",
    "Discard", "EnqueuedJob", "HeldLock", "Job", "JobContext", "JobError", "JobId", "JobKind", "JobNotFound",
    "JobState", "LockLost", "LockTimeout", "LoopBlocked", "MemoryBackend", "Middleware", "NurseryJobsError",
    "PeriodicInfo", "QueueConfig", "QueueFull", "QueueStats", "Rate", "Receipt", "RequestCache", "Resource",
    "ResourceError", "Resources", "RetryPolicy", "Runtime", "RuntimeClosed", "RuntimeSettings", "Snooze",
    "UnknownJob", "cached", "open_backend", "open_runtime", "publish", "run", "run_blocking",
}  # fmt: skip


def api_tables() -> str:
    """The API section of docs/quickstart.md: its tables and the prose between them."""
    page = QUICKSTART.read_text()
    return page[page.index("## The API") : page.index("### All of it, in one program")]


def export_problems(module: types.ModuleType, api: str) -> list[str]:
    """What is wrong with `module`'s public surface: a name in `__all__` that it does not define,
    that another package defines, or that neither the API tables name nor a docstring of its
    own explains; and a public attribute missing from `__all__`."""
    problems = []
    for name in module.__all__:
        if not hasattr(module, name):
            problems.append(f"{name}: in __all__ but not defined")
            continue
        obj = getattr(module, name)
        home = getattr(obj, "__module__", None) or ""
        if home.split(".")[0] != "nursery_jobs":
            problems.append(f"{name}: defined by {home or 'nobody'}, not nursery_jobs")
            continue
        own_doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
        if not re.search(rf"`[^`]*\b{re.escape(name)}\b[^`]*`", api) and not (own_doc or "").strip():
            problems.append(f"{name}: neither in docs/quickstart.md's API tables nor with a docstring")
    for name in sorted(vars(module)):
        value = getattr(module, name)
        if not name.startswith("_") and not isinstance(value, types.ModuleType) and name not in module.__all__:
            problems.append(f"{name}: public but not in __all__")
    return problems


def test_all_is_exactly_the_public_api():
    assert set(nj.__all__) == EXPECTED
    assert len(nj.__all__) == len(EXPECTED)  # no name twice


def test_every_export_is_ours_and_documented_and_nothing_public_is_left_out():
    assert export_problems(nj, api_tables()) == []


def test_the_export_check_sees_what_it_is_for():
    class Undocumented:
        pass

    Undocumented.__module__ = "nursery_jobs.somewhere"
    fake = types.ModuleType("nursery_jobs")
    fake.__all__ = ["App", "sleep", "Undocumented", "Missing"]
    fake.App, fake.sleep, fake.Undocumented, fake.stray = nj.App, trio.sleep, Undocumented, 1
    assert export_problems(fake, api_tables()) == [
        "sleep: defined by trio, not nursery_jobs",
        "Undocumented: neither in docs/quickstart.md's API tables nor with a docstring",
        "Missing: in __all__ but not defined",
        "stray: public but not in __all__",
    ]


def test_errors_share_one_base_class():
    for name in ("ArgsError", "BackendError", "BackendUnavailable", "ConfigError", "JobNotFound", "RuntimeClosed", "UnknownJob"):
        assert issubclass(getattr(nj, name), nj.NurseryJobsError)


def test_job_states():
    assert [s.value for s in nj.JobState] == [
        "available", "scheduled", "running", "retryable", "completed", "discarded", "cancelled",
    ]  # fmt: skip
    assert {s for s in nj.JobState if s.final} == {nj.JobState.COMPLETED, nj.JobState.DISCARDED, nj.JobState.CANCELLED}
