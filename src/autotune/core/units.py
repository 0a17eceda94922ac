"""Byte quantities as users write them ("80GiB", "24 GB", "1.5e9") and as we print them."""

from __future__ import annotations

import re

from autotune.errors import UserError

_SUFFIXES = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}

_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

GiB = 2**30
MiB = 2**20


def parse_bytes(text: str, *, what: str = "size") -> int:
    """Parse '80GiB', '80 GB', '24g', '1.5e9' into bytes; a bare number is bytes."""
    match = _PATTERN.match(str(text))
    if not match:
        raise UserError(f"invalid {what} {text!r}: expected a number with an optional unit, e.g. 80GiB or 24GB")
    number, suffix = match.groups()
    factor = _SUFFIXES.get(suffix.lower())
    if factor is None:
        raise UserError(f"invalid {what} {text!r}: unknown unit {suffix!r} (use GB, GiB, MB, MiB, TB, TiB)")
    value = int(float(number) * factor)
    if value <= 0:
        raise UserError(f"invalid {what} {text!r}: must be positive")
    return value


def format_bytes(n: float | None) -> str:
    """Human-readable binary size, e.g. 12.3 GiB; '-' for unknown."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit, size in (("TiB", 2**40), ("GiB", GiB), ("MiB", MiB), ("KiB", 2**10)):
        if n >= size:
            return f"{sign}{n / size:.1f} {unit}"
    return f"{sign}{int(n)} B"


def format_duration(seconds: float) -> str:
    """'42s', '3m12s', '1h05m': short enough for a progress line."""
    whole = max(round(seconds), 0)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
