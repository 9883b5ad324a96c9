"""Errors of the local stack; each message says what failed and what to do about it."""

from __future__ import annotations


class StackError(Exception):
    """Root of every error the local stack raises."""


class SetupError(StackError):
    """A component could not be found, built or installed."""


class StartError(StackError):
    """A component did not come up; the message names it and points at its log."""
