"""Errors of the local stack; each message says what failed and what to do about it.

A component that did not come up, or stopped while the stack ran, is a ComponentError:
besides the message it carries the component's name, the cause in a few lines (the end
of its log) and the path of its full log, so `python -m devstack up` can put all three on
the terminal while the rest of what happened stays in the logs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


class StackError(Exception):
    """Root of every error the local stack raises."""


class SetupError(StackError):
    """A component could not be found, built or installed."""


class ComponentError(StackError):
    """A component of the stack failed; says which, why, and where its full log is."""

    def __init__(
        self, message: str, *, component: str | None = None, cause: Sequence[str] = (), log_path: Path | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.component = component
        """The process's name (etcd, postgres-source, ...), or ferry's worker or watcher."""
        self.cause = tuple(cause)
        """The last meaningful lines of its log (or the error that stopped it), each trimmed."""
        self.log_path = log_path
        """The component's full log."""

    def __str__(self) -> str:
        lines = [f"{self.message}:" if self.cause else self.message]
        lines += [f"    {line}" for line in self.cause]
        if self.log_path is not None:
            lines.append(f"  full log: {self.log_path}")
        return "\n".join(lines)


class StartError(ComponentError):
    """A component did not come up."""


class ComponentStopped(ComponentError):
    """A component stopped while the stack was running."""
