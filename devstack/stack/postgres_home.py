"""Where the PostgreSQL instances keep their data: a folder the user they run as can enter.

PostgreSQL refuses to run as root, so when ferry runs as root the instances run as the
`postgres` user that Debian's package creates, and that user must be able to enter every
folder on the way to its data. A checkout in root's home (mode 700, the usual place on a
fresh machine) puts the state folder where it cannot. Then the data goes to a folder of
its own, `/var/tmp/ferry-postgres-<hash of the state folder>`, owned by postgres with mode
700, which the state folder links to (`postgres/<instance>/data`). The hash keeps two
checkouts apart; /var/tmp rather than /tmp because the data must survive a reboot as the
state folder does (/tmp is often a tmpfs). ferry changes no permission of the folders
above the state folder: opening root's home so that PostgreSQL can enter it would open it
to every user. Only the data folder has to move: PostgreSQL's log is a file ferry opens
for it, and it opens no Unix socket.

Whether the user can enter a folder is read from the permission bits of the folder and of
each folder above it, as the kernel applies them (the owner's bits to the owner, else the
group's to a member, else the others'), not by trying and failing. ACLs are not read: a
folder only an ACL opens counts as closed, which at worst moves the data out needlessly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pwd
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

from devstack.stack.errors import StartError

SERVICE_USER_WHEN_ROOT = "postgres"
OUTSIDE_PARENT = Path("/var/tmp")
OUTSIDE_PREFIX = "ferry-postgres-"
STATE_FOLDER_FILE = "state-folder"
"""In a folder outside the state folder: the state folder it belongs to, for people and for removing orphans."""


@dataclasses.dataclass(frozen=True)
class ServiceUser:
    """The account the instances run as when ferry runs as root."""

    name: str
    uid: int
    gid: int
    groups: frozenset[int]

    @classmethod
    def when_root(cls) -> ServiceUser | None:
        """The `postgres` user when ferry runs as root; None otherwise (the instances run as ferry's user)."""
        if os.geteuid() != 0:
            return None
        try:
            account = pwd.getpwnam(SERVICE_USER_WHEN_ROOT)
        except KeyError:
            raise StartError(
                f"PostgreSQL cannot run as root and there is no {SERVICE_USER_WHEN_ROOT!r} user to run it as. "
                "Install Debian's postgresql package (it creates the user) or run ferry as a normal user."
            ) from None
        groups = frozenset(os.getgrouplist(account.pw_name, account.pw_gid))
        return cls(account.pw_name, account.pw_uid, account.pw_gid, groups)

    def blocking(self, folder: Path) -> Path | None:
        """The first folder on the way to `folder` (itself included) that this user cannot enter, if any."""
        folder = folder.resolve()
        for path in (*reversed(folder.parents), folder):
            mode = path.stat()
            if mode.st_uid == self.uid:
                may_enter = mode.st_mode & stat.S_IXUSR
            elif mode.st_gid in self.groups:
                may_enter = mode.st_mode & stat.S_IXGRP
            else:
                may_enter = mode.st_mode & stat.S_IXOTH
            if not may_enter:
                return path
        return None

    def own(self, path: Path) -> None:
        os.chown(path, self.uid, self.gid)


@dataclasses.dataclass(frozen=True)
class DataHome:
    """Where the instances' data folders are: `<folder>/<instance>/data`."""

    folder: Path
    why_outside: str | None = None
    """Why `folder` is outside the state folder, for people; None when it is inside."""


def outside_folder(state_dir: Path, parent: Path = OUTSIDE_PARENT) -> Path:
    """The folder outside `state_dir` that holds its instances' data when the service user cannot enter it."""
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
    return parent / f"{OUTSIDE_PREFIX}{digest}"


def choose(postgres_dir: Path, instances: Sequence[str], user: ServiceUser | None) -> DataHome:
    """The data home of the instances whose state is in `postgres_dir` (`<state folder>/postgres`), made ready.

    Inside the state folder when the instances run as ferry's own user or the service user
    can enter it; otherwise outside, with a folder per instance owned by that user and a
    link to its data from the state folder. Once the data is outside, it stays there for as
    long as the state folder links to it, so that it survives a stop and a start.
    """
    for name in instances:
        (postgres_dir / name).mkdir(parents=True, exist_ok=True)
    if user is None:
        return DataHome(postgres_dir)
    links = [postgres_dir / name / "data" for name in instances]
    blocker = user.blocking(postgres_dir)
    outside = outside_folder(postgres_dir.parent)
    if any(link.is_symlink() for link in links):
        why = _cannot_enter(user, blocker) if blocker else "it went there on an earlier start, and stays there"
    elif blocker is None:
        return DataHome(postgres_dir)
    else:
        kept = [link for link in links if link.is_dir()]
        if kept:
            raise StartError(
                f"the data of PostgreSQL is in {kept[0].parent}, but {_cannot_enter(user, blocker)} any more. "
                "Make it enterable again, or remove the state folder to start afresh."
            )
        if outside.exists():
            # No link in this state folder leads to it: it belongs to a removed state folder of the same path.
            shutil.rmtree(outside)
        _remove_orphans(outside.parent)
        why = _cannot_enter(user, blocker)
    _ensure_outside(outside, postgres_dir.parent, user)
    for name, link in zip(instances, links, strict=True):
        instance = outside / name
        if not instance.is_dir():
            instance.mkdir(mode=0o700)
            user.own(instance)
        if not link.is_symlink():
            link.symlink_to(instance / "data")  # where the data is, for people looking in the state folder
    return DataHome(outside, why)


def _cannot_enter(user: ServiceUser, folder: Path) -> str:
    mode = stat.filemode(folder.stat().st_mode)
    return f"user {user.name!r}, which PostgreSQL runs as, cannot enter {folder} ({mode})"


def _ensure_outside(outside: Path, state_dir: Path, user: ServiceUser) -> None:
    if not outside.is_dir():
        outside.mkdir(mode=0o700)
        user.own(outside)
        outside.chmod(0o700)  # mkdir's mode is masked by the umask
        (outside / STATE_FOLDER_FILE).write_text(f"{state_dir}\n")
    blocker = user.blocking(outside)
    if blocker is not None:
        raise StartError(
            f"PostgreSQL's data can go neither to the state folder {state_dir} nor to {outside}: "
            f"{_cannot_enter(user, blocker)}. Choose a state folder it can enter with --state-dir."
        )


def _remove_orphans(parent: Path) -> None:
    """Removes the data folders outside whose state folder is gone: nothing can use them any more."""
    for folder in parent.glob(f"{OUTSIDE_PREFIX}*"):
        record = folder / STATE_FOLDER_FILE
        try:
            state_dir = Path(record.read_text().strip())
        except OSError:
            continue  # not one of ours, or not readable: leave it
        if not state_dir.exists():
            shutil.rmtree(folder, ignore_errors=True)
