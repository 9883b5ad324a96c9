"""Where PostgreSQL's data goes when ferry runs as root: a folder the `postgres` user can enter.

Whether a user can enter a folder is read from the permission bits of it and of every
folder above it, as the kernel applies them. The data stays in the state folder when the
`postgres` user can enter it, and goes to a folder of that user's own otherwise, which
the state folder links to. These tests need root (they change owners), as the case does.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.stack import postgres_home
from devstack.stack.errors import StartError
from devstack.stack.postgres_home import ServiceUser
from tests.conftest import make_closed_folder, make_state_dir, remove_state_dir

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(os.geteuid() != 0, reason="only root runs PostgreSQL as another user, and may chown"),
]

INSTANCES = ("source", "target")
SOMEONE = ServiceUser("someone", uid=4242, gid=4242, groups=frozenset({4242, 4343}))
"""A user who is nobody on this machine: owner of nothing but what a test gives it, member of group 4343."""


@pytest.fixture
def base() -> Iterator[Path]:
    folder = make_state_dir("ferry-home-")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def postgres() -> ServiceUser:
    user = ServiceUser.when_root()
    assert user is not None
    return user


@pytest.fixture
def closed() -> Iterator[Path]:
    """A folder like root's home (mode 700, root's), with state folders inside it."""
    folder = make_closed_folder("ferry-closed-")
    yield folder
    for state_dir in folder.iterdir():
        remove_state_dir(state_dir)
    shutil.rmtree(folder, ignore_errors=True)


def _folder(parent: Path, mode: int, uid: int = 0, gid: int = 0) -> Path:
    folder = parent / f"m{mode:o}-u{uid}-g{gid}"
    folder.mkdir()
    os.chown(folder, uid, gid)
    folder.chmod(mode)
    return folder


@pytest.mark.parametrize(
    ("mode", "uid", "gid", "enterable"),
    [
        (0o700, 0, 0, False),  # root's home
        (0o711, 0, 0, True),  # others may pass through
        (0o700, 4242, 0, True),  # its own
        (0o070, 4242, 4343, False),  # its own, and the owner's bits apply to the owner even if the group's allow
        (0o750, 0, 4343, True),  # a group it belongs to
        (0o705, 0, 4343, False),  # the group's bits apply to a member even if the others' allow
        (0o705, 0, 0, True),  # a group it does not belong to: the others' bits
    ],
)
def test_a_user_may_enter_a_folder_by_the_owner_bits_if_it_owns_it_else_the_group_bits_if_a_member_else_the_others(
    base: Path, mode: int, uid: int, gid: int, enterable: bool
) -> None:
    folder = _folder(base, mode, uid, gid)

    assert SOMEONE.blocking(folder) == (None if enterable else folder)


def test_the_first_folder_on_the_way_that_the_user_cannot_enter_is_the_one_named(base: Path) -> None:
    closed = _folder(base, 0o700)
    inner = _folder(closed, 0o755)

    assert SOMEONE.blocking(inner) == closed


def test_the_data_stays_in_the_state_folder_when_postgres_can_enter_it(base: Path, postgres: ServiceUser) -> None:
    home = postgres_home.choose(base / "state" / "postgres", INSTANCES, postgres)

    assert home.folder == base / "state" / "postgres"
    assert home.why_outside is None
    assert not (base / "state" / "postgres" / "source" / "data").exists()  # initdb makes it, in place
    assert not postgres_home.outside_folder(base / "state").exists()


def test_the_data_goes_to_a_folder_of_postgres_own_when_it_cannot_enter_the_state_folder(
    closed: Path, postgres: ServiceUser
) -> None:
    state_dir = closed / "state"

    home = postgres_home.choose(state_dir / "postgres", INSTANCES, postgres)

    outside = postgres_home.outside_folder(state_dir)
    assert home.folder == outside
    assert outside.parent == Path("/var/tmp")
    assert home.why_outside == f"user 'postgres', which PostgreSQL runs as, cannot enter {closed} (drwx------)"
    for folder in (outside, outside / "source", outside / "target"):
        mode = folder.stat()
        assert (mode.st_uid, stat.S_IMODE(mode.st_mode)) == (postgres.uid, 0o700)
    assert postgres.blocking(outside / "source") is None
    assert os.readlink(state_dir / "postgres" / "source" / "data") == str(outside / "source" / "data")
    assert (outside / "state-folder").read_text() == f"{state_dir}\n"


def test_two_state_folders_get_two_folders_outside(closed: Path, postgres: ServiceUser) -> None:
    first = postgres_home.choose(closed / "one" / "postgres", INSTANCES, postgres)
    second = postgres_home.choose(closed / "two" / "postgres", INSTANCES, postgres)

    assert first.folder != second.folder
    assert first.folder.is_dir()
    assert second.folder.is_dir()


def test_the_data_stays_outside_once_there_even_if_the_state_folder_opens_later(
    closed: Path, postgres: ServiceUser
) -> None:
    state_dir = closed / "state"
    first = postgres_home.choose(state_dir / "postgres", INSTANCES, postgres)
    (first.folder / "source" / "kept").write_text("data of the first start")
    closed.chmod(0o755)

    again = postgres_home.choose(state_dir / "postgres", INSTANCES, postgres)

    assert again.folder == first.folder
    assert (again.folder / "source" / "kept").read_text() == "data of the first start"


def test_a_state_folder_made_anew_at_the_same_path_starts_with_fresh_data(closed: Path, postgres: ServiceUser) -> None:
    state_dir = closed / "state"
    first = postgres_home.choose(state_dir / "postgres", INSTANCES, postgres)
    (first.folder / "source" / "stale").write_text("data whose password went with the state folder")
    shutil.rmtree(state_dir)

    again = postgres_home.choose(state_dir / "postgres", INSTANCES, postgres)

    assert again.folder == first.folder
    assert not (again.folder / "source" / "stale").exists()


def test_a_folder_outside_whose_state_folder_is_gone_is_removed_at_the_next_start(
    closed: Path, postgres: ServiceUser
) -> None:
    gone = postgres_home.choose(closed / "gone" / "postgres", INSTANCES, postgres)
    shutil.rmtree(closed / "gone")

    postgres_home.choose(closed / "new" / "postgres", INSTANCES, postgres)

    assert not gone.folder.exists()


def test_data_left_in_a_state_folder_postgres_can_no_longer_enter_is_named_with_what_to_do(
    base: Path, postgres: ServiceUser
) -> None:
    state_dir = base / "checkout" / "state"
    home = postgres_home.choose(state_dir / "postgres", INSTANCES, postgres)
    (home.folder / "source" / "data").mkdir()  # as initdb leaves it
    (base / "checkout").chmod(0o700)

    with pytest.raises(StartError) as refused:
        postgres_home.choose(state_dir / "postgres", INSTANCES, postgres)

    assert str(refused.value) == (
        f"the data of PostgreSQL is in {state_dir / 'postgres' / 'source'}, but user 'postgres', which PostgreSQL "
        f"runs as, cannot enter {base / 'checkout'} (drwx------) any more. Make it enterable again, or remove the "
        "state folder to start afresh."
    )
