"""What only the SQLite backend does: its file locking, its polling and its wake-ups between processes sharing one file."""
