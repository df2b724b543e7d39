"""Planted faults for the property suite's mutants: named bugs, each proven to turn its property red.

Each flag turns on one named bug from the mutant column of the property table (the module
docstrings of `tests/properties/test_p*.py`); `test_mutants.py` proves that the property guarding
it goes red. A property that no mutant can turn red is a toy.

None of them lives in the library: the harness plants each one through a seam the library
offers anyway -- a backend wrapping the memory backend (`harness.HarnessBackend`), the app the
harness declares (a queue one worker larger, a retry policy with its own randomness, middleware
around the attempt), or the settings it passes -- so production code reads no fault flag.
"""

from __future__ import annotations

import attrs

__all__ = ["Faults", "NO_FAULTS"]


@attrs.frozen
class Faults:
    system_task_children: bool = False
    """P01: a job's children are spawned as Trio system tasks (they escape every scope)."""
    children_in_queue_scope: bool = False
    """P02: a job's children are started into the queue's scope instead of the attempt's."""
    completer_drops_batch: bool = False
    """P03: the completer drops any batch of more than one outcome."""
    snooze_counts_attempt: bool = False
    """P04: a snooze spends an attempt."""
    pool_off_by_one: bool = False
    """P05: a queue starts max_workers + 1 workers."""
    drop_wakeup_during_fetch: bool = False
    """P06: a wake-up that lands while a claim is in flight is forgotten (a fetch cooldown)."""
    wait_misses_recorded: bool = False
    """P07: a receipt waiter only listens for future completions and misses a recorded one."""
    invert_priority: bool = False
    """P08: lower priority runs first."""
    outcome_from_exception_type: bool = False
    """P09: any cancellation of an attempt is taken for a timeout, whichever scope fired."""
    late_cancel_overwrites: bool = False
    """P10: cancelling a finished job overwrites its outcome with cancelled."""
    swallow_service_errors: bool = False
    """P11: runtime services run detached, so their crashes are logged and swallowed."""
    unbounded_grace: bool = False
    """P13: shutdown waits for running jobs without the grace bound."""
    enqueue_checkpoint_after_insert: bool = False
    """P14: enqueue yields (and can be cancelled) after the job was already inserted."""
    unseeded_jitter: bool = False
    """P15: retry jitter comes from the OS's entropy instead of the seeded RNG."""


NO_FAULTS = Faults()
