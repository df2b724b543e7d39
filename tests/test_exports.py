"""The public surface changes only on purpose (trio's test_exports, in small)."""

import nursery_jobs as nj

EXPECTED = {
    "App", "ArgsError", "Backend", "BackendError", "BackendUnavailable", "ConfigError", "Discard", "Job", "JobContext", "JobError",
    "JobId", "JobKind", "JobNotFound", "JobState", "MemoryBackend", "NurseryJobsError", "QueueConfig",
    "QueueStats", "Receipt", "RetryPolicy", "Runtime", "RuntimeClosed", "RuntimeSettings",
    "Snooze", "UnknownJob", "open_backend", "open_runtime", "run", "run_blocking",
}  # fmt: skip


def test_all_is_exactly_the_public_api():
    assert set(nj.__all__) == EXPECTED
    for name in nj.__all__:
        assert getattr(nj, name) is not None


def test_errors_share_one_base_class():
    for name in ("ArgsError", "BackendError", "BackendUnavailable", "ConfigError", "JobNotFound", "RuntimeClosed", "UnknownJob"):
        assert issubclass(getattr(nj, name), nj.NurseryJobsError)


def test_job_states():
    assert [s.value for s in nj.JobState] == [
        "available", "scheduled", "running", "retryable", "completed", "discarded", "cancelled",
    ]  # fmt: skip
    assert {s for s in nj.JobState if s.final} == {nj.JobState.COMPLETED, nj.JobState.DISCARDED, nj.JobState.CANCELLED}
