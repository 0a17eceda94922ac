"""SLURM's compressed host lists ("gpu[01-03,07],cpu5") expanded to one name per node.

`scontrol show hostnames` is the reference and is used when present; the parser below covers the
same syntax for machines without the SLURM client tools (and for tests), so a job never depends on
`scontrol` being on PATH inside a container.
"""

from __future__ import annotations

import itertools
import math
import shutil
import subprocess
from collections.abc import Callable

from autotune.errors import UserError

ScontrolRunner = Callable[[str], list[str] | None]

# Far above any job's node count (the largest SLURM clusters have ~10^4 nodes); a bound so that a typo
# like n[1-100000000] is one line, not minutes of expansion and a MemoryError.
MAX_HOSTS = 65536


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets: "a[1,2],b" -> ["a[1,2]", "b"]."""
    parts: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "[":
            depth += 1
            if depth > 1:
                raise UserError(f"malformed host list {text!r}: nested brackets")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise UserError(f"malformed host list {text!r}: unbalanced ']'")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += char
    if depth != 0:
        raise UserError(f"malformed host list {text!r}: unbalanced '['")
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _expand_range(text: str, whole: str) -> list[str]:
    """One bracket body like "01-03,07": numbers keep the zero padding of the range's first bound."""
    values: list[str] = []
    for item in text.split(","):
        item = item.strip()
        low, dash, high = item.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise UserError(f"malformed host list {whole!r}: bad range {item!r}")
        if not dash:
            values.append(low)
            continue
        if int(high) < int(low):
            raise UserError(f"malformed host list {whole!r}: range {item!r} runs backwards")
        if int(high) - int(low) + 1 + len(values) > MAX_HOSTS:
            raise UserError(f"host list {whole!r} names more than {MAX_HOSTS} hosts")
        width = len(low)
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values


def _expand_item(item: str, whole: str) -> list[str]:
    """One host pattern, possibly with several bracket groups ("rack[1-2]-n[01-02]": their product)."""
    pieces: list[list[str]] = []
    rest = item
    while "[" in rest:
        prefix, _, after = rest.partition("[")
        body, closed, rest = after.partition("]")
        if not closed or not body:
            raise UserError(f"malformed host list {whole!r}: empty or unclosed brackets in {item!r}")
        pieces.append([prefix])
        pieces.append(_expand_range(body, whole))
    pieces.append([rest])
    if math.prod(len(piece) for piece in pieces) > MAX_HOSTS:
        raise UserError(f"host list {whole!r} names more than {MAX_HOSTS} hosts")
    return ["".join(combo) for combo in itertools.product(*pieces)]


def parse_hostlist(text: str) -> list[str]:
    """Expand SLURM host-list syntax without SLURM: "gpu[01-03,07],cpu5" -> gpu01 gpu02 gpu03 gpu07 cpu5."""
    hosts: list[str] = []
    for item in _split_top_level(text):
        hosts.extend(_expand_item(item, text))
        if len(hosts) > MAX_HOSTS:
            raise UserError(f"host list {text!r} names more than {MAX_HOSTS} hosts")
    if not hosts:
        raise UserError(f"empty host list {text!r}")
    return hosts


def scontrol_hostnames(text: str) -> list[str] | None:
    """`scontrol show hostnames`, or None when scontrol is missing or fails (the parser takes over)."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    try:
        done = subprocess.run(
            [scontrol, "show", "hostnames", text], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    hosts = done.stdout.split()
    return hosts if done.returncode == 0 and hosts else None


def expand_hostlist(text: str, scontrol: ScontrolRunner = scontrol_hostnames) -> list[str]:
    """SLURM's own expansion when available, else ours; both give the allocation order SLURM uses."""
    return scontrol(text) or parse_hostlist(text)
