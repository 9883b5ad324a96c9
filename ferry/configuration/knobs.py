"""How a settings field becomes a knob: its flag, its environment variables, its section of --help.

Every leaf field of a component's settings tree is a knob. Field `poll_interval` is
`--poll-interval` and `FERRY_POLL_INTERVAL`; a nested settings object may put a prefix
before its fields' names (`Group(prefix="temporal-")` makes `temporal.address`
`--temporal-address`). `Knob` on a field says what the derived name would get wrong,
such as a name users know from an earlier release or a flag given in other units.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from pydantic import ConfigDict
from pydantic.dataclasses import is_pydantic_dataclass
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

SETTINGS = ConfigDict(use_attribute_docstrings=True, extra="forbid", allow_inf_nan=False)
"""The pydantic configuration of every settings class: a field's docstring is its description. No setting is
infinite or NaN: every number of seconds ends in a sleep, a wait or a timeout, where inf raises OverflowError (or
NaN waits for ever) long after startup, naming nothing; the command refuses it at once instead."""

ENV_PREFIX = "FERRY_"

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Knob:
    """Annotated metadata of a leaf field whose flag, variables or help differ from the derived ones."""

    flag: str | None = None
    """The flag without its dashes, e.g. `identity`; the variable is FERRY_ and the flag in capitals."""
    also_env: tuple[str, ...] = ()
    """Variables read when the FERRY_ one is unset or empty, in this order (e.g. KUBECONFIG)."""
    unit: int = 1
    """The flag counts in units of this many of the field's own (e.g. MiB for a field in bytes)."""
    unit_name: str | None = None
    """What --help calls that unit."""
    section: str | None = None
    """The section of --help it is listed in, when not its group's."""
    secret: bool = False
    """Its value is never repeated, not even in an error message."""


@dataclasses.dataclass(frozen=True)
class Group:
    """Annotated metadata of a field holding nested settings: how its knobs are named and listed."""

    section: str | None = None
    """The section of --help for its knobs (default: the enclosing group's)."""
    prefix: str = ""
    """Put before the derived flag of each of its knobs, e.g. `temporal-`."""


MISSING: Any = object()
"""The default of a knob whose default is computed when the settings are made (e.g. the host name)."""


@dataclasses.dataclass(frozen=True)
class Option:
    """One knob, as the command line and the environment know it."""

    path: tuple[str, ...]
    """Field names from the root of the settings tree, e.g. ("temporal", "address")."""
    flag: str
    """e.g. `--temporal-address`."""
    env: tuple[str, ...]
    """The variables that set it, the FERRY_ one first."""
    description: str
    """The field's docstring, on one line."""
    default: Any
    """The field's default, or MISSING when it is computed."""
    annotation: Any
    """The field's type."""
    knob: Knob
    section: str | None
    """The section of --help it is listed in; None: the command's own options."""

    @property
    def dest(self) -> str:
        """Its attribute in argparse's namespace."""
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def names(self) -> str:
        """How messages name it: `--poll-interval (FERRY_POLL_INTERVAL)`."""
        return f"{self.flag} ({', '.join(self.env)})"


def options(cls: type[Any]) -> tuple[Option, ...]:
    """Every knob of a settings class, its nested settings' included, in the order they are declared."""
    if cls not in _known:
        _known[cls] = _checked(cls, tuple(_walk(cls, (), "", None)))
    return _known[cls]


_known: dict[type[Any], tuple[Option, ...]] = {}


def _checked(cls: type[Any], found: tuple[Option, ...]) -> tuple[Option, ...]:
    for attribute in ("flag", "env"):
        seen: set[object] = set()
        for option in found:
            names = option.env if attribute == "env" else (option.flag,)
            clash = seen.intersection(names)
            if clash:
                raise TypeError(f"{cls.__name__}: {sorted(map(str, clash))} name two knobs; give one a Knob(flag=...)")
            seen.update(names)
    return found


def _walk(cls: type[Any], path: tuple[str, ...], prefix: str, section: str | None) -> list[Option]:
    if not is_pydantic_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a settings class: decorate it with pydantic's dataclass")
    fields: dict[str, FieldInfo] = cls.__pydantic_fields__
    found: list[Option] = []
    for name, info in fields.items():
        group = _metadata(info, Group)
        nested = (
            info.annotation if isinstance(info.annotation, type) and is_pydantic_dataclass(info.annotation) else None
        )
        if nested is not None:
            group = group or Group()
            found += _walk(nested, (*path, name), prefix + group.prefix, group.section or section)
            continue
        knob = _metadata(info, Knob) or Knob()
        flag = knob.flag or prefix + name.replace("_", "-")
        found.append(
            Option(
                path=(*path, name),
                flag=f"--{flag}",
                env=(ENV_PREFIX + flag.upper().replace("-", "_"), *knob.also_env),
                description=_description(cls, name),
                default=MISSING if info.default is PydanticUndefined else info.default,
                annotation=info.annotation,
                knob=knob,
                section=knob.section or section,
            )
        )
    return found


def _description(cls: type[Any], name: str) -> str:
    # pydantic reads docstrings from the class's own source: an inherited field's is in its base's.
    for base in cls.__mro__:
        info = getattr(base, "__pydantic_fields__", {}).get(name)
        if info is not None and info.description:
            return " ".join(info.description.split())
    return ""


def _metadata(info: FieldInfo, kind: type[T]) -> T | None:
    return next((item for item in info.metadata if isinstance(item, kind)), None)
