"""The plugin's exit codes and its one error type: one line for the terminal, never a traceback."""

from __future__ import annotations

import enum

from ferry.api.migration import Phase


class Exit(enum.IntEnum):
    """What the plugin's exit code tells a script (MEANINGS says it in words, for --help)."""

    OK = 0
    ERROR = 1
    USAGE = 2
    NO_ANSWER = 3
    FAILED = 4
    ROLLED_BACK = 5
    ABANDONED = 6
    NOT_PLANNED = 7


MEANINGS = {
    Exit.OK: "done: the control was accepted; the Migration Succeeded, or is still under way (status without -w)",
    Exit.ERROR: "the saga refused the control, or the command could not do its work (one line on stderr says why)",
    Exit.USAGE: "the command line is wrong",
    Exit.NO_ANSWER: "the control was written, but the watcher recorded no answer within --timeout "
    "(the annotation stays: a watcher that comes back still acts on it)",
    Exit.FAILED: "the Migration ended Failed (an undo kept failing; its message says what is left)",
    Exit.ROLLED_BACK: "the Migration ended RolledBack",
    Exit.ABANDONED: "the Migration ended Abandoned (its workflow was terminated from outside)",
    Exit.NOT_PLANNED: "plan: the checks found problems (printed); nothing was changed",
}

EXIT_CODES_HELP = "exit codes:\n" + "\n".join(f"  {code.value}  {MEANINGS[code]}" for code in Exit)
"""The table of exit codes, for --help."""

_BY_PHASE = {Phase.FAILED: Exit.FAILED, Phase.ROLLED_BACK: Exit.ROLLED_BACK, Phase.ABANDONED: Exit.ABANDONED}


def exit_for_phase(phase: str | None) -> Exit:
    """The exit code of `status` for a Migration in this phase: non-zero only for the unhappy ends."""
    try:
        return _BY_PHASE.get(Phase(phase or Phase.PENDING.value), Exit.OK)
    except ValueError:
        return Exit.OK


class PluginError(Exception):
    """Something the plugin cannot do, said in one line that names the problem and what to do."""

    def __init__(self, message: str, code: Exit = Exit.ERROR) -> None:
        super().__init__(message)
        self.code = code
