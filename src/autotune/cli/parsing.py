"""Parsers for list-valued options shared by the tune and hook commands."""

from __future__ import annotations

from autotune.errors import UserError
from autotune.ladder import Rung, parse_rung


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


def parse_rung_list(text: str | None) -> tuple[Rung, ...] | None:
    if not text:
        return None
    try:
        return tuple(parse_rung(v.strip()) for v in text.split(",") if v.strip())
    except ValueError as error:
        raise UserError(str(error)) from None


def parse_name_list(text: str | None) -> tuple[str, ...] | None:
    """'q_proj, v_proj' -> ('q_proj', 'v_proj'); None or blanks -> None."""
    names = tuple(part.strip() for part in text.split(",") if part.strip()) if text else ()
    return names or None
