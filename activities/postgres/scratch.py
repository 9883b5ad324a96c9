"""The worker's scratch folders on local disk, which a killed worker cannot leave behind for good.

A restore around streams reads the main archive into a folder of the worker's temporary
directory (TMPDIR): as big as the database's schema and its largest tables. A worker
killed meanwhile (OOM, SIGKILL, a node drained without grace) never runs its cleanup,
and each retry on the same host would leave one more copy until the disk is full.

Each folder holds a lock file, locked (flock) for as long as the folder is in use. The
kernel drops the lock when its holder dies, however it dies, and the lock is seen from
every process that shares the file system, whatever PID namespace it runs in. So before
a new folder is made, every folder whose lock can be taken is one nobody uses any more,
and is removed. A folder is made under a hidden name and renamed once locked, so no
sweep ever sees one of them unlocked while it is still being set up.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

PREFIX = "ferry-scratch-"
LOCK = ".in-use"

log = logging.getLogger("ferry.scratch")


@contextlib.contextmanager
def scratch_folder(parent: Path | None = None) -> Iterator[Path]:
    """A new folder under `parent` (the temporary directory by default), removed on the way out, after the folders
    that workers which are gone left there."""
    parent = Path(parent if parent is not None else tempfile.gettempdir())
    remove_abandoned(parent)
    making = Path(tempfile.mkdtemp(prefix=f".{PREFIX}", dir=parent))
    lock = os.open(making / LOCK, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        folder = making.with_name(making.name.removeprefix("."))
        making.rename(folder)
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        os.close(lock)
        shutil.rmtree(making, ignore_errors=True)  # only when the rename did not happen


def remove_abandoned(parent: Path) -> list[Path]:
    """Removes the scratch folders under `parent` that no living process holds; returns them.

    A folder without a lock file is left alone: it is not one of these (or was made by a
    version of ferry before them).
    """
    removed = []
    for folder in parent.glob(f"{PREFIX}*"):
        if _abandoned(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
            log.warning("removed %s, left by a worker that stopped while using it", folder)
    return removed


def _abandoned(folder: Path) -> bool:
    try:
        lock = os.open(folder / LOCK, os.O_RDWR | os.O_CLOEXEC)
    except OSError:  # no lock file, or not ours to open: not a folder this module may judge
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(lock)  # also releases the lock, if it was taken
    return True
