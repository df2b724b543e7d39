"""Unit tests: one module, rule or file of the repository, checked in-process with no database server and no worker processes."""
