"""What only the SQLite backend does: its file locking, its polling, its wake-ups between processes sharing one file, and its schema (upgrades, what its indexes cost a write)."""
