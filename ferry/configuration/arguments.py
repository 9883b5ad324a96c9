"""A settings class as argparse options: one flag per knob, its docstring as its --help.

argparse only collects the raw strings of the flags given; what they mean, their
defaults and their checks stay with the settings class (loading.py), so a value from a
flag and one from a variable are checked alike, and --help cannot drift from the code.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from ferry.configuration.knobs import MISSING, Option, options
from ferry.configuration.loading import load

T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    """Adds a flag for every knob of `cls`, listed in its section of --help."""
    sections: dict[str | None, Any] = {None: parser}
    for option in options(cls):
        if option.section not in sections:
            sections[option.section] = parser.add_argument_group(option.section)
        sections[option.section].add_argument(
            option.flag,
            dest=option.dest,
            default=argparse.SUPPRESS,  # absent from the namespace unless given
            metavar=_metavar(option.annotation),
            help=help_text(option).replace("%", "%%"),
        )


def from_arguments(cls: type[T], args: argparse.Namespace, environ: Mapping[str, str]) -> T:
    """The settings from the flags argparse collected, then the environment, then the defaults."""
    given = {option.dest: getattr(args, option.dest) for option in options(cls) if hasattr(args, option.dest)}
    return load(cls, given, environ)


def help_text(option: Option) -> str:
    """The docstring, the variables, the unit and the default: `... [FERRY_X] (default: 1.0)`."""
    notes = []
    if option.knob.unit_name:
        notes.append(f"in {option.knob.unit_name}")
    if option.default is not MISSING and option.default not in (None, ()):
        default = option.default // option.knob.unit if option.knob.unit != 1 else option.default
        notes.append(f"default: {default}")
    text = f"{option.description} [{', '.join(option.env)}]"
    return f"{text} ({'; '.join(notes)})" if notes else text


def _metavar(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Annotated:
        return _metavar(typing.get_args(annotation)[0])
    kinds = [kind for kind in typing.get_args(annotation) if kind is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return _metavar(kinds[0]) if len(kinds) == 1 else "VALUE"
    if typing.get_origin(annotation) is typing.Literal:
        return "{" + ",".join(str(kind) for kind in kinds) + "}"
    if typing.get_origin(annotation) is tuple:
        return "A,B,..."
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "PATH"
    return {int: "N", float: "NUMBER"}.get(annotation, "TEXT")
