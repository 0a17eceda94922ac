"""Printing helpers: rich tables for people, JSON for scripts."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

PIPE_WIDTH = 200  # piped output (SLURM logs, CI) is not wrapped at rich's default 80 columns


def console() -> Console:
    if sys.stdout.isatty():
        return Console(highlight=False, soft_wrap=False)
    return Console(highlight=False, soft_wrap=True, width=PIPE_WIDTH)


def err_console() -> Console:
    if sys.stderr.isatty():
        return Console(stderr=True, highlight=False)
    return Console(stderr=True, highlight=False, soft_wrap=True, width=PIPE_WIDTH)


def stamped(message: str) -> str:
    """A plain progress line for logs: UTC time, then the message."""
    from datetime import datetime, timezone

    return f"{datetime.now(timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')} autotune: {message}"


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
