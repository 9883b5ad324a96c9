"""Starts the stack's programs so that none of them can outlive the stack.

Three guards, from the gentlest to the bluntest:
1. `stop()` signals each program's whole process group, waits, then kills it.
2. Every child asks the kernel for SIGKILL when the process that started it dies
   (PR_SET_PDEATHSIG), so a stack whose owner is killed outright still goes away.
3. The pids of a run are written to a file in the state folder; the next start of
   the same state folder kills any that are still alive before starting anew.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import logging
import os
import pwd
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from devstack.stack.errors import ComponentError, ComponentStopped, StartError
from devstack.stack.logtail import cause_lines

log = logging.getLogger("devstack.stack.processes")

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child between fork and exec, after any change of user: the kernel
    # clears the parent-death signal on credential changes, so it must be set last.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def as_user(user: str | None) -> dict[str, Any]:
    """subprocess arguments that run a program as `user`, with that user's own groups (not root's)."""
    if user is None:
        return {}
    account = pwd.getpwnam(user)
    return {
        "user": account.pw_uid,
        "group": account.pw_gid,
        "extra_groups": os.getgrouplist(account.pw_name, account.pw_gid),
    }


GOGC = "400"
"""The garbage collector's target for the stack's Go programs (etcd, the Kubernetes control plane, kwok, Temporal,
versitygw) unless the environment sets GOGC. Go's default, 100, collects each time the heap has doubled; on a
machine of two cores shared by the whole stack, CPU is what runs short and memory is plentiful, and the API server
decoding and encoding objects for fifty Migrations at once collects often. With 400 the fleet benchmark's status
writes were answered sooner (docs/performance.md, "Fifty Migrations at once"), at the price of a larger heap."""


def go_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a Go program of the stack: `base` (else this process's) with GOGC unless it sets one."""
    env = dict(os.environ if base is None else base)
    env.setdefault("GOGC", GOGC)
    return env


@dataclasses.dataclass
class ManagedProcess:
    """One long-running program of the stack, with its own log file."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    user: str | None = None
    """Run as this user (PostgreSQL refuses to run as root)."""
    stop_signal: int = signal.SIGTERM
    stop_timeout: float = 15.0
    """Seconds to wait after stop_signal before killing the process group."""
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            # The parent-death signal fires when the *thread* that forked exits.
            raise RuntimeError("stack processes must be started from the main thread")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log_file:
            log_file.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(self.argv)}\n".encode())
            log_file.flush()
            try:
                self.popen = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    cwd=self.cwd,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                    **as_user(self.user),
                )
            except (OSError, subprocess.SubprocessError) as error:  # a binary missing, not executable, ...
                cause = str(error)
                if isinstance(error, OSError):
                    cause = f"{error.strerror}: {error.filename or self.argv[0]}"
                log_file.write(f"could not start it: {cause}\n".encode())
                raise StartError(
                    f"{self.name} could not be started", component=self.name, cause=[cause], log_path=self.log_path
                ) from error
        log.debug("started %s (pid %d): %s", self.name, self.popen.pid, " ".join(self.argv))

    @property
    def pid(self) -> int:
        if self.popen is None:
            raise RuntimeError(f"{self.name} was not started")
        return self.popen.pid

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def check_alive(self) -> None:
        """Raises StartError, with the end of its log, when the program has exited."""
        if self.popen is not None and self.popen.poll() is not None:
            raise self.failure(f"{self.exit_description()} while starting")

    def check_running(self) -> None:
        """Raises ComponentStopped, with the end of its log, when the program has exited."""
        if self.popen is not None and self.popen.poll() is not None:
            raise self.failure(f"{self.exit_description()} while the stack was running", ComponentStopped)

    def exit_description(self) -> str:
        """How the program ended, e.g. "exited with code 1" or "was killed by SIGKILL"."""
        code = self.popen.returncode if self.popen is not None else None
        if code is not None and code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def failure(self, what: str, kind: type[ComponentError] = StartError) -> ComponentError:
        """An error naming this program, `what` happened to it, its log's last meaningful lines and the log's path."""
        cause = cause_lines(self.log_path)
        return kind(f"{self.name} {what}", component=self.name, cause=cause, log_path=self.log_path)

    def stop(self) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            _signal_group(self.popen.pid, self.stop_signal)
            try:
                self.popen.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0fs; killing it", self.name, self.stop_timeout)
        # Whatever the leader left behind in its group goes too.
        _signal_group(self.popen.pid, signal.SIGKILL)
        if self.popen.poll() is None:
            self.popen.wait(5)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class PidFile:
    """Remembers which programs a state folder's stack started, to clean up after a crash."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def record(self, processes: list[ManagedProcess]) -> None:
        entries = [{"name": p.name, "pid": p.pid, "start_time": _start_time(p.pid)} for p in processes if p.popen]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(entries, indent=1))

    def kill_leftovers(self) -> list[str]:
        """Kills the process groups of a previous run that are still alive; returns their names."""
        if not self.path.exists():
            return []
        killed = []
        for entry in json.loads(self.path.read_text()):
            pid = int(entry["pid"])
            # A pid is only the same process if its start time matches too.
            if _start_time(pid) is not None and _start_time(pid) == entry.get("start_time"):
                _signal_group(pid, signal.SIGKILL)
                killed.append(str(entry["name"]))
        self.path.unlink()
        return killed

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


@dataclasses.dataclass(frozen=True)
class ProcessStat:
    """One process as /proc/<pid>/stat shows it: its command (field 2, which may hold spaces and parentheses) and
    the fields after it, `fields[0]` being field 3 (the state)."""

    pid: int
    command: str
    fields: tuple[str, ...]

    @classmethod
    def read(cls, pid: int) -> ProcessStat | None:
        """The process's stat; None when it is gone (or ended while being read)."""
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        return cls(pid, stat[stat.index("(") + 1 : stat.rindex(")")], tuple(stat[stat.rindex(")") + 2 :].split()))

    @property
    def state(self) -> str:
        return self.fields[0]

    @property
    def parent(self) -> int:
        return int(self.fields[1])

    @property
    def group(self) -> int:
        return int(self.fields[2])

    @property
    def own_cpu_ticks(self) -> int:
        """User and system time in clock ticks (fields 14 and 15)."""
        return int(self.fields[11]) + int(self.fields[12])

    @property
    def cpu_ticks(self) -> int:
        """User and system time in clock ticks, with those of its children it has reaped (fields 14 to 17)."""
        return self.own_cpu_ticks + int(self.fields[13]) + int(self.fields[14])

    @property
    def start_time(self) -> int:
        """Field 22: when it started, in clock ticks after boot; with the pid, it names one process for good."""
        return int(self.fields[19])


def process_stats() -> Iterator[ProcessStat]:
    """Every process on the machine, skipping those that end while being read."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := ProcessStat.read(int(entry.name))) is not None:
            yield stat


def _start_time(pid: int) -> int | None:
    stat = ProcessStat.read(pid)
    return None if stat is None else stat.start_time


def group_members(pgids: set[int]) -> list[int]:
    """Every live process whose process group is one of `pgids`."""
    return [stat.pid for stat in process_stats() if stat.state != "Z" and stat.group in pgids]


def processes_under(folder: Path) -> list[tuple[int, str]]:
    """Every live process whose command line mentions `folder`: for checking cleanup."""
    needle = str(folder)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if needle in cmdline and int(entry.name) != os.getpid():
            found.append((int(entry.name), cmdline.strip()))
    return found
