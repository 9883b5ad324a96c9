"""The deployment files as a reader sees them: the repository's paths, its YAML, its Dockerfile and ferry's CLI.

Shared by the tests of tests/deploy, which check these files against the code they deploy:
the `ferry` command's real parser and settings decide which subcommands and FERRY_ variables exist.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import functools
import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import yaml

from ferry import cli
from ferry.configuration.arguments import from_arguments
from ferry.configuration.knobs import options
from ferry.configuration.loading import SettingsError
from watcher.settings import WatcherSettings
from worker.settings import WorkerSettings

ROOT = Path(__file__).parent.parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
SYSTEM_NAMESPACE = "ferry-system"


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def documents(path: Path) -> list[dict[str, Any]]:
    """Every YAML document of a file, or of the .yaml files of a folder (kustomization.yaml aside)."""
    files = [path] if path.is_file() else sorted(p for p in path.glob("*.yaml") if p.name != "kustomization.yaml")
    return [doc for file in files for doc in yaml.safe_load_all(file.read_text()) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [doc for doc in docs if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


# --- the ferry command --------------------------------------------------------------------------


def subcommands() -> dict[str, argparse.ArgumentParser]:
    """`ferry`'s subcommands, from its real parser."""
    parser = cli.build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("ferry's parser has no subcommands")


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """ferry's parser, built once: parsing does not change it, and building it is what costs."""
    return cli.build_parser()


def settings(argv: list[str], variables: dict[str, str] | None = None) -> Any:
    """What `ferry <argv>` would run with, given exactly these environment variables (none of the test run's)."""
    args = _parser().parse_args(argv)
    return from_arguments(SETTINGS[args.command], args, variables or {})


SETTINGS: dict[str, type[Any]] = {"worker": WorkerSettings, "watcher": WatcherSettings}
"""The settings class behind each long-running subcommand."""

_SENTINELS = ("7", "70", "0.75", "sentinel", "text", "127.0.0.1:7", str(ROOT / "pyproject.toml"), str(ROOT))
"""Values to try for a variable: one at least fits each knob's type and limits and differs from its default."""


def variables_read_by(command: str) -> set[str]:
    """The FERRY_ variables that change what `ferry <command>` runs with.

    Each variable the subcommand's settings declare is tried: it counts only if setting
    it to one of the sentinels (alone, without any flag) changes the settings it loads. A
    variable valid only with another (the TLS certificate and its key) does not count alone.
    """
    defaults = settings([command])
    read = set()
    for option in options(SETTINGS[command]):
        for name in option.env:
            for sentinel in _SENTINELS:
                try:
                    changed = settings([command], {name: sentinel}) != defaults
                except SettingsError:
                    continue
                if changed:
                    read.add(name)
                    break
    return read


# --- the Dockerfile -----------------------------------------------------------------------------

Instruction = tuple[str, str]
"""(INSTRUCTION, its arguments), continuation lines joined."""


@dataclasses.dataclass(frozen=True)
class Dockerfile:
    global_arguments: dict[str, str]
    """ARG defaults declared before the first FROM, which FROM lines may use."""
    stages: list[list[Instruction]]
    """Each build stage's instructions, its FROM first."""

    def base_image(self, stage: list[Instruction]) -> str:
        image = stage[0][1].split()[0]
        return re.sub(r"\$\{(\w+)\}", lambda match: self.global_arguments[match.group(1)], image)

    @property
    def final(self) -> list[Instruction]:
        """The stage that is the image."""
        return self.stages[-1]


def dockerfile() -> Dockerfile:
    logical = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    global_arguments: dict[str, str] = {}
    stages: list[list[Instruction]] = []
    for line in logical.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, arguments = line.partition(" ")
        instruction, arguments = instruction.upper(), " ".join(arguments.split())
        if instruction == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction, arguments))
        elif instruction == "ARG":
            name, _, default = arguments.partition("=")
            global_arguments[name] = default
    return Dockerfile(global_arguments, stages)


def exec_form(arguments: str) -> list[str]:
    """The JSON array of an ENTRYPOINT or CMD; the shell form (a plain string) fails here."""
    parsed = json.loads(arguments)
    assert isinstance(parsed, list), f"{arguments} is not in exec form"
    return [str(item) for item in parsed]


def stage_env(stage: list[Instruction]) -> dict[str, str]:
    """The ENV key=value pairs a stage sets."""
    found: dict[str, str] = {}
    for instruction, arguments in stage:
        if instruction == "ENV":
            for pair in arguments.split():
                name, _, value = pair.partition("=")
                found[name] = value
    return found


# --- the build context --------------------------------------------------------------------------


def _matches(pattern: str, path: str) -> bool:
    """Whether a .dockerignore pattern names `path` or a folder above it (`**` matching any folders)."""
    parts = path.split("/")
    for end in range(1, len(parts) + 1):
        prefix = "/".join(parts[:end])
        if fnmatch.fnmatchcase(prefix, pattern):
            return True
        if pattern.startswith("**/") and any(
            fnmatch.fnmatchcase("/".join(parts[start:end]), pattern[3:]) for start in range(end)
        ):
            return True
    return False


def in_build_context(path: str) -> bool:
    """Whether `docker build .` sends `path` (relative to the repository) to the builder, by .dockerignore.

    Docker's rules: the patterns in order, the last one naming the path (or a folder above it) decides,
    and `!` takes a path back in.
    """
    sent = True
    for line in DOCKERIGNORE.read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        keep = pattern.startswith("!")
        if _matches(pattern.lstrip("!").rstrip("/"), path):
            sent = keep
    return sent


def repository_files() -> list[str]:
    """Every file of the checkout git knows, and a few a working copy has beside them."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    local = [".venv/bin/python", ".ferry/stack.json", "ferry/__pycache__/cli.cpython-311.pyc", ".git/HEAD"]
    return [*listed.splitlines(), *local]
