"""Parsers for the list-valued options the commands share: option text -> the `TuneRequest` field's value."""

from __future__ import annotations

from collections.abc import Sequence

from autotune.core.ladder import Rung, parse_rung
from autotune.errors import UserError


def parse_int_list(text: str | None, what: str) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        values = tuple(sorted({int(v) for v in text.split(",") if v.strip()}))
    except ValueError:
        raise UserError(f"{what} must be a comma-separated list of integers, got {text!r}") from None
    if not values or values[0] <= 0:
        raise UserError(f"{what} must list positive integers, got {text!r}")
    return values


def parse_micro_batches(text: str | None) -> tuple[int, ...] | None:
    """--micro-batches '8,2,2' -> (2, 8): the grid, sorted, each once."""
    return parse_int_list(text, "--micro-batches")


def parse_rung_list(text: str | None) -> tuple[Rung, ...] | None:
    if not text:
        return None
    try:
        return tuple(parse_rung(v.strip()) for v in text.split(",") if v.strip())
    except ValueError as error:
        raise UserError(str(error)) from None


def parse_name_list(text: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """'q_proj, v_proj' (an option) or ['q_proj', 'v_proj'] (a tuning's record) -> ('q_proj', 'v_proj');
    None or blanks -> None."""
    parts = text.split(",") if isinstance(text, str) else (text or ())
    names = tuple(part.strip() for part in parts if part.strip())
    return names or None


def command_words(words: Sequence[str] | None) -> tuple[str, ...] | None:
    """The launch command after `--` (own-command mode); none given -> None (autotune's own worker)."""
    return tuple(words) if words else None
