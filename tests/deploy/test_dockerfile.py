"""The production image: the `ferry` command from the locked dependencies, pg_dump beside it, not as root.

No Docker engine runs here, so the Dockerfile is read, not built; every check compares it
with what it must agree with: pyproject.toml, the lock's uv, ferry's real parser, the
stack's newest PostgreSQL major and the Deployments in deploy/manager.
"""

from __future__ import annotations

import re

import pytest

from devstack.stack.versions import TARGET_POSTGRES_MAJOR
from tests.deploy.files import (
    DEPLOY,
    ROOT,
    dockerfile,
    documents,
    exec_form,
    in_build_context,
    pyproject,
    repository_files,
    stage_env,
    subcommands,
    variables_read_by,
)

pytestmark = pytest.mark.unit


def _arguments(instruction: str) -> list[str]:
    return [arguments for name, arguments in dockerfile().final if name == instruction]


def _copied_into_build_stage() -> set[str]:
    """Every source path the build stage copies from the build context."""
    sources: set[str] = set()
    for name, arguments in dockerfile().stages[0]:
        if name == "COPY" and not arguments.startswith("--from"):
            sources.update(arguments.split()[:-1])
    return sources


def test_the_image_runs_the_ferry_console_script_and_by_default_its_worker() -> None:
    (entrypoint,) = _arguments("ENTRYPOINT")
    (command,) = _arguments("CMD")

    assert exec_form(entrypoint) == ["ferry"]
    assert pyproject()["project"]["scripts"]["ferry"] == "ferry.cli:entry"
    assert exec_form(command) == ["worker"]
    assert "worker" in subcommands()


def test_the_image_installs_the_locked_dependencies_without_the_dev_group() -> None:
    build = dockerfile().stages[0]
    runs = [arguments for name, arguments in build if name == "RUN"]
    syncs = [run for run in runs if run.startswith("uv sync")]

    assert syncs, "the build stage never runs uv sync"
    for sync in syncs:
        assert "--frozen" in sync.split(), f"{sync}: without --frozen, uv may resolve afresh instead of using uv.lock"
        assert "--no-dev" in sync.split(), f"{sync}: the dev group (pytest, mypy, ...) does not belong in the image"
    assert "--no-editable" in syncs[-1].split(), "ferry must be installed into the environment, not linked to /src"
    assert {"pyproject.toml", "uv.lock"} <= _copied_into_build_stage()


def test_the_image_uses_the_uv_that_made_the_lock() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    locked = re.search(r"^UV_VERSION=(\S+)$", setup, re.MULTILINE)
    assert locked is not None

    build = dockerfile().stages[0]
    (declared,) = [arguments for name, arguments in build if name == "ARG" and arguments.startswith("UV_VERSION=")]

    assert declared == f"UV_VERSION={locked.group(1)}"


def test_the_image_holds_every_package_of_ferrys_wheel() -> None:
    packages = pyproject()["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    copied = _copied_into_build_stage()

    assert set(packages) <= copied, f"not copied into the image: {set(packages) - copied}"
    assert pyproject()["project"]["readme"] in copied, "building the wheel needs the readme it declares"


def test_the_image_has_pg_dump_and_pg_restore_of_the_stacks_newest_postgresql_major() -> None:
    image = dockerfile()
    runs = " ".join(arguments for name, arguments in image.final if name == "RUN")
    bindir = stage_env(image.final)["FERRY_POSTGRES_BINDIR"]

    # PostgreSQL's own repository serves Debian bookworm; Debian's postgresql-common adds it.
    assert image.base_image(image.final).startswith("python:3.11-slim-bookworm")
    assert "/usr/share/postgresql-common/pgdg/apt.postgresql.org.sh" in runs.split()
    assert f"postgresql-client-{TARGET_POSTGRES_MAJOR}" in runs.split()
    assert bindir == f"/usr/lib/postgresql/{TARGET_POSTGRES_MAJOR}/bin"


def test_the_image_sets_only_variables_the_worker_reads() -> None:
    ferry_variables = {name for name in stage_env(dockerfile().final) if name.startswith("FERRY_")}

    assert ferry_variables <= variables_read_by("worker")


def test_the_image_runs_as_the_non_root_user_the_deployments_expect() -> None:
    (user,) = _arguments("USER")
    uid, _, gid = user.partition(":")
    manifests = documents(DEPLOY / "manager")
    deployments = [doc for doc in manifests if doc["kind"] == "Deployment"]

    assert uid.isdigit(), "a numeric user lets Kubernetes verify runAsNonRoot"
    assert int(uid) != 0
    assert deployments
    for deployment in deployments:
        pod_security = deployment["spec"]["template"]["spec"]["securityContext"]
        assert (pod_security["runAsUser"], pod_security["runAsGroup"]) == (int(uid), int(gid))


def test_the_build_context_holds_ferrys_packages_and_the_files_that_build_them_and_nothing_else() -> None:
    sent = [path for path in repository_files() if in_build_context(path)]
    packages = pyproject()["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]

    assert {path.split("/")[0] for path in sent} == {*packages, "pyproject.toml", "uv.lock", "README.md"}
    assert {path.split("/")[0] for path in sent} == _copied_into_build_stage()
    assert "ferry/cli.py" in sent
    assert not [path for path in sent if "__pycache__" in path]


@pytest.mark.parametrize("left_out", ["devstack", "tests", "scripts", "deploy", "docs", ".venv", ".ferry", ".git"])
def test_the_local_stack_the_tests_and_the_local_environment_never_reach_the_builder(left_out: str) -> None:
    present = [path for path in repository_files() if path.split("/")[0] == left_out]

    assert present, f"{left_out} is in the checkout, so this checks something"
    assert not [path for path in present if in_build_context(path)]


def test_no_stage_copies_the_local_stack_and_the_image_copies_only_the_built_environment() -> None:
    image = dockerfile()
    copied = [arguments.split() for stage in image.stages for name, arguments in stage if name == "COPY"]
    final = [arguments.split() for name, arguments in image.final if name == "COPY"]

    assert not [words for words in copied if any(word.startswith(("devstack", "tests", "scripts")) for word in words)]
    assert final == [["--from=build", "/opt/ferry", "/opt/ferry"]]
