"""ferry's workflow modules are safe to import once per worker, outside the per-run sandbox (worker/sandbox.py).

Two promises make that safe, and these tests hold the modules to them: nothing a run could
change lives at module level (every global is a class, a function, a module, or a value
that cannot be changed), and no workflow file calls what the sandbox would refuse a run
(the clock, randomness, the file system, the network, threads, subprocesses).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import pkgutil
import re
import types
import typing
from datetime import date, datetime, time, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.common import RetryPolicy, SearchAttributeKey

import workflows
from worker.sandbox import PASSED_THROUGH, WORKFLOW_RUNNER

pytestmark = pytest.mark.unit

MODULES = [workflows.__name__, *(found.name for found in pkgutil.walk_packages(workflows.__path__, "workflows."))]
FILES = sorted(Path(workflows.__file__).parent.glob("*.py"))

SHARED_BY_DESIGN: dict[type, str] = {
    RetryPolicy: "the SDK's retry policy: a dataclass it only reads when it schedules an activity",
}
"""Types whose instances are mutable in principle yet shared as constants, and why that is safe."""

REFUSED_IMPORTS = ("os", "random", "secrets", "socket", "subprocess", "threading", "time", "urllib", "uuid")
"""Modules a workflow file may not import: each offers a clock, randomness or I/O. `workflow.now()`,
`workflow.random()`, `workflow.uuid4()` and activities are the deterministic ways."""
REFUSED_CALLS = {"now", "utcnow", "today", "fromtimestamp", "utcfromtimestamp"}
"""Clock readings on `datetime` or `date`."""
REFUSED_BUILTINS = {"open", "input", "exec", "eval", "__import__"}


def _unchangeable(value: Any, depth: int = 0) -> str | None:
    """None when `value` cannot be changed by the code that uses it; otherwise what it is."""
    if depth > 6:
        return None
    if value is None or isinstance(value, bool | int | float | complex | str | bytes | range | enum.Enum):
        return None
    if isinstance(value, timedelta | datetime | date | time | re.Pattern | SearchAttributeKey):
        return None
    if isinstance(value, types.ModuleType | type | types.FunctionType | types.BuiltinFunctionType | property):
        return None
    if isinstance(value, typing.TypeVar) or type(value).__module__ in ("typing", "__future__"):
        return None
    if isinstance(value, tuple | frozenset):
        return next((found for item in value if (found := _unchangeable(item, depth + 1))), None)
    if isinstance(value, types.MappingProxyType):
        return next((found for item in value.values() if (found := _unchangeable(item, depth + 1))), None)
    if type(value) in SHARED_BY_DESIGN:
        return None
    if dataclasses.is_dataclass(value) and getattr(getattr(type(value), "__dataclass_params__", None), "frozen", False):
        return next(
            (
                found
                for field in dataclasses.fields(value)
                if (found := _unchangeable(getattr(value, field.name), depth + 1))
            ),
            None,
        )
    return f"a {type(value).__module__}.{type(value).__qualname__}"


def refusals(source: str) -> list[str]:
    """What in one workflow file's source reaches for a clock, randomness or I/O, as `line: what`."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [f"{line}: import {alias.name}" for alias in node.names if _refused(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and _refused(node.module):
            found.append(f"{line}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            called = node.func
            if isinstance(called, ast.Name) and called.id in REFUSED_BUILTINS:
                found.append(f"{line}: {called.id}()")
            elif (
                isinstance(called, ast.Attribute)
                and called.attr in REFUSED_CALLS
                and isinstance(called.value, ast.Name)
                and called.value.id in ("datetime", "date")
            ):
                found.append(f"{line}: {called.value.id}.{called.attr}()")
    return found


def _refused(module: str) -> bool:
    return module.split(".")[0] in REFUSED_IMPORTS


def test_the_worker_passes_the_workflow_package_through_its_sandbox() -> None:
    assert (workflows.__name__,) == PASSED_THROUGH
    assert set(PASSED_THROUGH) <= WORKFLOW_RUNNER.restrictions.passthrough_modules


@pytest.mark.parametrize("name", MODULES)
def test_a_workflow_module_keeps_nothing_a_run_could_change_at_module_level(name: str) -> None:
    module = importlib.import_module(name)

    changeable = {
        key: what for key, value in vars(module).items() if not key.startswith("__") and (what := _unchangeable(value))
    }

    assert changeable == {}, f"{name} shares mutable state between runs; make it a tuple, frozenset or frozen dataclass"


@pytest.mark.parametrize("name", MODULES)
def test_a_workflow_modules_classes_keep_nothing_a_run_could_change_on_the_class(name: str) -> None:
    """Attributes of a class outlive its instances: a workflow class's are shared by every run of the process."""
    module = importlib.import_module(name)
    classes = [
        value
        for value in vars(module).values()
        if isinstance(value, type) and value.__module__ == name and not issubclass(value, enum.Enum)
    ]

    changeable = {
        f"{cls.__name__}.{key}": what
        for cls in classes
        for key, value in vars(cls).items()
        if not key.startswith("__")
        and not isinstance(value, staticmethod | classmethod)
        and not inspect.isdatadescriptor(value)
        and (what := _unchangeable(value))
    }

    assert changeable == {}, f"{name} shares mutable class attributes between runs"


@pytest.mark.parametrize("path", FILES, ids=[path.name for path in FILES])
def test_a_workflow_file_calls_no_clock_randomness_or_io(path: Path) -> None:
    assert refusals(path.read_text()) == []


def test_the_checks_see_what_they_look_for() -> None:
    """The checks can fail: each kind of refusal, and each kind of changeable global, is found."""
    source = (
        "import uuid\nfrom time import monotonic\nfrom datetime import datetime\n"
        "def run():\n    open('x')\n    return datetime.now()\n"
    )
    assert refusals(source) == ["1: import uuid", "2: from time import ...", "5: open()", "6: datetime.now()"]
    assert _unchangeable([1]) == "a builtins.list"
    assert _unchangeable(({"a": 1},)) == "a builtins.dict"

    @dataclasses.dataclass
    class Loose:
        attempts: int

    @dataclasses.dataclass(frozen=True)
    class Holding:
        inner: Loose

    assert _unchangeable(Holding(Loose(1))) is not None
    assert _unchangeable((timedelta(seconds=1), "x", frozenset({1}))) is None

    class Shared:
        runs: list[str] = []  # noqa: RUF012 - the very thing the check finds

    assert _unchangeable(vars(Shared)["runs"]) == "a builtins.list"
