"""Committed results name no path of the machine they ran on: the repository becomes relative, a temporary
directory `<tmp>`, the interpreter `python3`, the home directory `~`.

A result file is read on other machines and in review; an absolute path says nothing there, and leaks the layout of
the machine that wrote it. Every benchmark that writes commands or captured output into `results/` passes its data
through `portable()` first; tests/test_machine_paths.py fails on any committed text file that still holds one.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _rules(repo: Path) -> list[tuple[re.Pattern[str], str]]:
    """Longest first: an interpreter whole (a virtualenv inside the repository too), then the repository, so that
    a worktree under a temporary directory becomes relative, not `<tmp>/...`."""
    temp = re.escape(tempfile.gettempdir().rstrip("/"))
    return [
        (re.compile(r"(?:/[\w.+-]+)*/bin/python3?(?:\.\d+)?\b"), "python3"),  # an interpreter, wherever installed
        (re.compile(re.escape(str(repo)) + r"/?"), ""),
        (re.compile(re.escape(sys.prefix) + r"/"), "<python>/"),
        (re.compile(temp + r"/[\w.+-]+"), "<tmp>"),
        (re.compile(re.escape(str(Path.home())) + r"(?=/|\b)"), "~"),
    ]


def portable(value: Any, repo: Path = REPO) -> Any:
    """`value` (JSON-like: dicts, lists, strings) with every machine path rewritten; other values unchanged."""
    rules = _rules(repo)

    def fix(item: Any) -> Any:
        if isinstance(item, str):
            for pattern, replacement in rules:
                item = pattern.sub(replacement, item)
            return item
        if isinstance(item, dict):
            return {fix(key): fix(val) for key, val in item.items()}
        if isinstance(item, list):
            return [fix(val) for val in item]
        return item

    return fix(value)
