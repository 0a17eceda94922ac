"""Printing helpers: rich tables for people, JSON for scripts."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console


def console() -> Console:
    return Console(highlight=False, soft_wrap=False)


def err_console() -> Console:
    return Console(stderr=True, highlight=False)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
