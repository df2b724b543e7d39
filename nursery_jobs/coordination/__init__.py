"""Coordination between requests and jobs: receipt waiters (`receipts`), bounded in-request
waiting for a job's outcome, and named locks across processes (`locks`). Leases will live here too."""
