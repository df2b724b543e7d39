"""Tests of one part of the package or of the repository's own files, run in this process with no database server and no worker processes."""
