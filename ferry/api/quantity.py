"""Kubernetes quantities (20Gi, 500M, 1.5e9) as numbers, for sizes that ferry compares and estimates with."""

from __future__ import annotations

import decimal
import re

_SUFFIXES: dict[str, decimal.Decimal] = {
    "": decimal.Decimal(1),
    "m": decimal.Decimal("0.001"),
    **{suffix: decimal.Decimal(10) ** (3 * power) for power, suffix in enumerate("kMGTPE", 1)},
    **{f"{suffix}i": decimal.Decimal(2) ** (10 * power) for power, suffix in enumerate("KMGTPE", 1)},
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(?:[eE]([+-]?[0-9]+)|([a-zA-Z]*))$")
"""A number, then an exponent (1e3) or a suffix (20Gi; 1E and 1Ei are exa and exbi, not exponents)."""


def quantity_bytes(quantity: str) -> int:
    """The number a quantity stands for, rounded up to a whole byte; ValueError naming the quantity if it is none."""
    found = _QUANTITY.match(quantity.strip())
    if found is None:
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity (e.g. 20Gi)")
    number, exponent, suffix = found.groups()
    try:
        value = decimal.Decimal(number)
    except decimal.InvalidOperation:
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity (e.g. 20Gi)") from None
    if exponent is not None:
        value = value.scaleb(int(exponent))
    elif suffix in _SUFFIXES:
        value *= _SUFFIXES[suffix]
    else:
        raise ValueError(f"{quantity!r} has an unknown suffix {suffix!r} (e.g. Ki, Mi, Gi, k, M, G)")
    return int(value.to_integral_value(rounding=decimal.ROUND_CEILING))
