"""Filling a settings tree from flags, then FERRY_ variables, then defaults; a bad value is one line.

A value comes from its flag when the flag is given, else from its first variable that is
set and not empty, else the field's default applies. An empty flag (`--metrics-address=`)
also means the default. pydantic checks every value against its field's type and limits;
the first problem becomes a SettingsError naming the flag, the variables, the problem
and where the value came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from ferry.configuration.knobs import Option, options

T = TypeVar("T")


class SettingsError(ValueError):
    """A setting's value cannot be used; the message is one line saying which and why."""


def load(cls: type[T], given: Mapping[str, str], environ: Mapping[str, str]) -> T:
    """The settings of `cls` from the flags in `given` (raw, by Option.dest), the environment and the defaults."""
    values: dict[str, Any] = {}
    origins: dict[tuple[str, ...], tuple[str, str]] = {}
    for option in options(cls):
        found = _raw(option, given, environ)
        if found is None or not found[1]:
            continue
        origins[option.path] = found
        _assign(values, option.path, _in_field_units(option, *found))
    try:
        return TypeAdapter(cls).validate_python(values)
    except ValidationError as error:
        raise SettingsError(_describe(cls, error.errors(), origins)) from None


def _raw(option: Option, given: Mapping[str, str], environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(where it came from, the raw value), or None when nothing sets it."""
    if option.dest in given:
        return option.flag, given[option.dest]
    for name in option.env:
        if environ.get(name):
            return name, environ[name]
    return None


def _assign(values: dict[str, Any], path: tuple[str, ...], value: object) -> None:
    for name in path[:-1]:
        values = values.setdefault(name, {})
    values[path[-1]] = value


def _in_field_units(option: Option, origin: str, raw: str) -> object:
    if option.knob.unit == 1:
        return raw
    try:
        return TypeAdapter(int).validate_python(raw) * option.knob.unit
    except ValidationError as error:
        raise SettingsError(_one(option, error.errors()[0], (origin, raw))) from None


def _describe(cls: type[Any], errors: list[ErrorDetails], origins: dict[tuple[str, ...], tuple[str, str]]) -> str:
    first = errors[0]
    location = tuple(str(part) for part in first["loc"])
    knobs = [option for option in options(cls) if location[: len(option.path)] == option.path]
    if knobs:
        option = knobs[0]
        line = _one(option, first, origins.get(option.path))
    else:
        # A rule across several knobs (the message names them); say which of them were set, and how.
        line = _message(first)
        involved = [option for option in options(cls) if option.path[: len(location)] == location]
        set_here = [_assignment(option, origins[option.path]) for option in involved if option.path in origins]
        if set_here:
            line += f" (set: {', '.join(set_here)})"
    if len(errors) > 1:
        line += f"; and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''}"
    return line


def _one(option: Option, error: ErrorDetails, origin: tuple[str, str] | None) -> str:
    line = f"{option.names}: {_message(error)}"
    if origin is not None:
        line += f" ({_set_by(option, origin)})"
    return line


def _set_by(option: Option, origin: tuple[str, str]) -> str:
    where, raw = origin
    return f"set by {where}" if option.knob.secret else f"got {raw!r} from {where}"


def _assignment(option: Option, origin: tuple[str, str]) -> str:
    where, raw = origin
    return where if option.knob.secret else f"{where}={raw!r}"


def _message(error: ErrorDetails) -> str:
    message = error["msg"].removeprefix("Value error, ")
    return message[0].lower() + message[1:] if message.startswith("Input ") else message
