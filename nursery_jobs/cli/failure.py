"""How a command fails: one line on stderr, and the exit code that says whose the mistake is.

A user's mistake (a bad URL, a `MODULE:APP` that names nothing, an option out of range) is
answered with ``nursery-jobs <command>: <message>`` and exit code 2 -- no traceback, which would
bury the one line that says what to change. What went wrong while running (a server that cannot
be reached) is the same line with exit code 1. Every module of the command raises these; click
shows them.
"""

from __future__ import annotations

import click

__all__ = ["Failure", "RunFailure"]


class Failure(click.ClickException):
    """A user's error, shown as one line: ``nursery-jobs <command>: <message>``."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        ctx = click.get_current_context(silent=True)
        self.command = ctx.command_path if ctx is not None else "nursery-jobs"

    def show(self, file: object = None) -> None:
        click.echo(f"{self.command}: {self.format_message()}", err=True)


class RunFailure(Failure):
    """What went wrong while running (a server that cannot be reached): exit code 1."""

    exit_code = 1
