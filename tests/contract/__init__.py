"""Each backend protocol method called directly, from each starting state, on every registered backend."""
