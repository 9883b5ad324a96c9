"""A worker killed while restoring leaves its copy of the main archive on disk only until the next restore there.

Real processes hold the folders here and are killed with SIGKILL: nothing of theirs runs on the way out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.postgres.scratch import PREFIX, remove_abandoned, scratch_folder

pytestmark = pytest.mark.unit

HOLDER = """
import sys, time
from pathlib import Path
from activities.postgres.scratch import scratch_folder
with scratch_folder(Path(sys.argv[1])) as folder:
    (folder / "main.dump").write_bytes(b"x" * 4096)
    print(folder, flush=True)
    time.sleep(600)
"""


def _holder(parent: Path) -> tuple[subprocess.Popen[str], Path]:
    """A process that restores in a scratch folder under `parent`: the process, and its folder (once it exists)."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(parent)], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2]
    )
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    assert line, f"the holder exited with {process.wait()} before making its folder"
    return process, Path(line)


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def test_a_folder_left_by_a_killed_worker_is_removed_by_the_next_restore_there(
    tmp_path: Path, holders: list[subprocess.Popen[str]]
) -> None:
    process, left = _holder(tmp_path)
    holders.append(process)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert (left / "main.dump").exists(), "SIGKILL runs no cleanup"

    with scratch_folder(tmp_path) as folder:
        assert not left.exists()
        assert folder.is_dir()
        assert folder.name.startswith(PREFIX)
    assert not folder.exists()
    assert list(tmp_path.iterdir()) == []


def test_a_folder_a_running_worker_restores_in_is_kept(tmp_path: Path, holders: list[subprocess.Popen[str]]) -> None:
    process, busy = _holder(tmp_path)
    holders.append(process)

    with scratch_folder(tmp_path):
        assert (busy / "main.dump").stat().st_size == 4096
    assert remove_abandoned(tmp_path) == []
    assert busy.exists()


def test_folders_that_are_not_scratch_folders_are_left_alone(tmp_path: Path) -> None:
    unlocked = tmp_path / f"{PREFIX}without-a-lock-file"  # nothing says whether it is in use
    unlocked.mkdir()
    (tmp_path / "ferry-snapshot-abc").mkdir()  # what restores made before scratch folders

    assert remove_abandoned(tmp_path) == []
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(["ferry-snapshot-abc", unlocked.name])


def _restore_that_fails(parent: Path) -> None:
    with scratch_folder(parent) as folder:
        (folder / "main.dump").write_bytes(b"x")
        raise RuntimeError("pg_restore failed")


def test_a_folder_is_removed_however_the_restore_in_it_ends(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="pg_restore failed"):
        _restore_that_fails(tmp_path)

    assert list(tmp_path.iterdir()) == []
