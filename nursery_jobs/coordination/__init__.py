"""Coordination between requests and jobs: receipt waiters (`receipts`), bounded in-request
waiting for a job's outcome. Leases and locks will live here too."""
