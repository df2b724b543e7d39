"""The runtime end to end through its public API, written once and run with the same expectations on every backend."""
