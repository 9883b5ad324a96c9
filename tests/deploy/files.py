"""The deployment files as a reader sees them: the repository's paths, its YAML, its Dockerfile and ferry's CLI.

Shared by the tests of tests/deploy, which check these files against the code they deploy:
the `ferry` command's real parser decides which subcommands and FERRY_ variables exist.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from ferry import cli

ROOT = Path(__file__).parent.parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
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


@contextlib.contextmanager
def environment(variables: dict[str, str]) -> Iterator[None]:
    """os.environ without any FERRY_ or KUBECONFIG variable of the test run, plus `variables`."""
    saved = dict(os.environ)
    try:
        for name in [name for name in os.environ if name.startswith("FERRY_") or name == "KUBECONFIG"]:
            del os.environ[name]
        os.environ.update(variables)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def parse(argv: list[str], variables: dict[str, str] | None = None) -> argparse.Namespace:
    """What `ferry <argv>` would run with, given these environment variables (the parser reads them when built)."""
    with environment(variables or {}):
        return cli.build_parser().parse_args(argv)


_SENTINELS: dict[Any, str] = {int: "7", float: "7.5", Path: "/sentinel/path", None: "sentinel"}


def variables_read_by(command: str) -> set[str]:
    """The FERRY_ variables that change what `ferry <command>` runs with.

    Each option of the subcommand is tried: its variable is set to a sentinel, and it
    counts only if the parsed option then holds that sentinel.
    """
    read = set()
    for action in subcommands()[command]._actions:
        if action.dest == "help":
            continue
        name = f"FERRY_{action.dest.upper()}"
        sentinel = _SENTINELS[action.type]
        expected = action.type(sentinel) if callable(action.type) else sentinel
        if getattr(parse([command], {name: sentinel}), action.dest) == expected:
            read.add(name)
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
