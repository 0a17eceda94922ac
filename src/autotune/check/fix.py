"""--fix: apply the findings' edits to a copy of the config, in order, and describe each change.

An edit under a key that an earlier edit removed is skipped, so a removed section never comes back
half-filled. Edits that change nothing are not listed. A fix that sets a training value (batch sizes,
optimizer, schedule, precision, clipping) is withheld unless the caller allows it (--fix-training):
a config that trains differently after --fix is worse than one that does not start.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from autotune.check.findings import ConfigPath, Edit, Finding, Fix, dotted, touches_training

_MISSING = object()


def _parent(config: dict[str, Any], path: ConfigPath, create: bool) -> dict[str, Any] | None:
    node: Any = config
    for key in path[:-1]:
        if not isinstance(node, dict):
            return None
        if key not in node:
            if not create:
                return None
            node[key] = {}
        node = node[key]
    return node if isinstance(node, dict) else None


def _show(value: Any) -> str:
    return json.dumps(value)


def apply_edit(config: dict[str, Any], edit: Edit) -> str | None:
    """Apply one edit in place; return the change as a line for the user, or None if nothing changed."""
    if edit.op == "remove":
        parent = _parent(config, edit.path, create=False)
        if parent is None or edit.path[-1] not in parent:
            return None
        old = parent.pop(edit.path[-1])
        return f"{dotted(edit.path)}: removed (was {_show(old)})"
    if edit.op == "set":
        parent = _parent(config, edit.path, create=True)
        if parent is None:
            return None
        old = parent.get(edit.path[-1], _MISSING)
        if old is not _MISSING and old == edit.value and type(old) is type(edit.value):
            return None
        parent[edit.path[-1]] = copy.deepcopy(edit.value)
        before = "unset" if old is _MISSING else _show(old)
        return f"{dotted(edit.path)}: {before} -> {_show(edit.value)}"
    if edit.op == "move":
        source = _parent(config, edit.path, create=False)
        if source is None or edit.path[-1] not in source:
            return None
        target = _parent(config, edit.to, create=True)
        if target is None or edit.to[-1] in target:
            return None
        target[edit.to[-1]] = source.pop(edit.path[-1])
        return f"{dotted(edit.path)} -> {dotted(edit.to)} (value {_show(target[edit.to[-1]])})"
    raise ValueError(f"unknown edit operation {edit.op!r}")


def _under(path: ConfigPath, removed: list[ConfigPath]) -> bool:
    return any(path[: len(gone)] == gone for gone in removed)


def changes_training(fix: Fix) -> bool:
    """Declared by the rule, or implied: setting or moving a value onto a training key."""
    if fix.changes_training is not None:
        return fix.changes_training
    return any(edit.op in ("set", "move") and touches_training(edit.to or edit.path) for edit in fix.edits)


def apply_fixes(
    config: dict[str, Any],
    findings: list[Finding],
    allow_training_changes: bool = True,
    withheld: list[str] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """A fixed copy of `config` and the list of changes, one line each, with the reason.

    Fixes that change training are skipped unless allowed, and described in `withheld`.
    """
    fixed = copy.deepcopy(config)
    changes: list[str] = []
    removed: list[ConfigPath] = []
    for finding in findings:
        if finding.fix is None:
            continue
        if not allow_training_changes and changes_training(finding.fix):
            if withheld is not None:
                withheld.append(f"{finding.path or '(config)'}: {finding.fix.description}")
            continue
        for edit in finding.fix.edits:
            if _under(edit.path, removed) or (edit.op == "move" and _under(edit.to, removed)):
                continue
            change = apply_edit(fixed, edit)
            if change is None:
                continue
            changes.append(f"{change} [{finding.rule}: {_reason(finding)}]")
            if edit.op in ("remove", "move"):
                removed.append(edit.path)
    return fixed, changes


def _reason(finding: Finding) -> str:
    """The first sentence of the finding: why the change was made."""
    first = finding.message.split(": ")[0] if finding.rule == "deepspeed" else finding.message.split(". ")[0]
    return first.rstrip(".")
