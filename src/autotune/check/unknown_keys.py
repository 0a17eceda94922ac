"""Unknown and misplaced keys, at every level DeepSpeed reads.

Severity follows what DeepSpeed does with the key: sections parsed by pydantic models refuse unknown
keys (error); the top level and plain-dict sections drop them without a word (warning).
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel

from autotune.check import schema
from autotune.check.findings import ConfigPath, Edit, Finding, Fix, Severity, dotted, is_comment_key

_CLOSE_MATCH = 0.75  # difflib ratio above which a key is taken for a misspelling


def _version() -> str:
    from autotune.check.initialize import deepspeed_version

    return deepspeed_version()


def _did_you_mean(key: str, candidates: set[str] | frozenset[str]) -> str | None:
    close = difflib.get_close_matches(key, sorted(candidates), n=1, cutoff=_CLOSE_MATCH)
    return close[0] if close else None


def _rename_or_remove(path: ConfigPath, target: ConfigPath | None, siblings: dict[str, Any]) -> Fix:
    """Rename to the intended key when it is free; otherwise drop the stray key."""
    if target is not None and target[-1] not in siblings:
        return Fix(f"rename to {dotted(target)}", (Edit("move", path, to=target),))
    return Fix("remove it", (Edit("remove", path),))


def _misplaced_top_level(config: dict[str, Any], key: str, section: str) -> Finding:
    destination = (section, key)
    section_value = config.get(section)
    if section_value is None or (isinstance(section_value, dict) and key not in section_value):
        fix = Fix(f"move it under {section}", (Edit("move", (key,), to=destination),))
    else:
        fix = Fix(f"remove it ({section} sets its own)", (Edit("remove", (key,)),))
    return Finding(
        Severity.WARNING,
        key,
        f"DeepSpeed ignores a top-level {key!r}: it belongs under {section!r}, where it means something.",
        "unknown-key",
        fix=fix,
    )


def _comment(path: ConfigPath) -> Finding:
    where = "at the top level" if len(path) == 1 else f"in {dotted(path[:-1])!r}"
    message = f"A comment key {where}: DeepSpeed ignores it; --fix keeps it."
    return Finding(Severity.INFO, dotted(path), message, "comment")


def _comment_in_model_section(path: ConfigPath, config_siblings: dict[str, Any]) -> Finding:
    """DeepSpeed refuses it there; the text survives as a top-level key, which DeepSpeed ignores."""
    destination = (dotted(path),)
    message = (
        f"A comment key inside {dotted(path[:-1])!r}: this section refuses unknown keys "
        "(extra inputs are not permitted), so DeepSpeed refuses the config."
    )
    fix = Fix(
        f"move it to the top level as {destination[0]!r} (kept, and ignored there)",
        (Edit("move", path, to=destination),),
    )
    return Finding(Severity.ERROR, dotted(path), message, "comment", fix=fix)


def _unknown_top_level(config: dict[str, Any], key: str) -> Finding:
    owners = schema.owning_sections(key)
    if len(owners) == 1:
        return _misplaced_top_level(config, key, owners[0])
    guess = _did_you_mean(key, schema.top_level_keys())
    hint = f" Did you mean {guess!r}?" if guess else ""
    return Finding(
        Severity.WARNING,
        key,
        f"Unknown top-level key: DeepSpeed ignores it without a warning.{hint}",
        "unknown-key",
        fix=_rename_or_remove((key,), (guess,) if guess else None, config),
    )


def _model_section(path: ConfigPath, value: dict[str, Any], model: type[BaseModel]) -> list[Finding]:
    findings: list[Finding] = []
    accepted = schema.model_keys(model)
    removed = schema.removed_zero_keys() if path == ("zero_optimization",) else {}
    for key, item in value.items():
        item_path = (*path, key)
        field = accepted.get(key)
        if field is None and is_comment_key(key) and not removed.get(key):
            findings.append(_comment_in_model_section(item_path, value))
            continue
        if field is None:
            findings.append(_unknown_model_key(item_path, item, set(accepted), removed.get(key), siblings=value))
            continue
        replacement = schema.deprecated_replacement(field)
        if replacement is not None:
            instead = f"; use {replacement!r} instead" if replacement else ""
            findings.append(
                Finding(Severity.INFO, dotted(item_path), f"Deprecated in DeepSpeed{instead}.", "deprecated")
            )
        nested = schema.model_of(field)
        if nested is not None and isinstance(item, dict):
            findings += _model_section(item_path, item, nested)
    return findings


def _unknown_model_key(
    path: ConfigPath, item: Any, accepted: set[str], removed_reason: str | None, siblings: dict[str, Any]
) -> Finding:
    section = dotted(path[:-1])
    if removed_reason:
        return Finding(
            Severity.ERROR,
            dotted(path),
            f"{removed_reason.strip()} (refused by DeepSpeed {_version()})",
            "unknown-key",
            fix=Fix("remove it", (Edit("remove", path),)),
        )
    guess = _did_you_mean(path[-1], accepted)
    hint = f" Did you mean {guess!r}?" if guess else ""
    if item == "auto":  # DeepSpeedConfigModel drops "auto" values before pydantic sees the key
        severity, reaction = Severity.WARNING, 'DeepSpeed drops it silently because its value is "auto"'
    else:
        severity, reaction = Severity.ERROR, "DeepSpeed refuses the config (extra inputs are not permitted)"
    target = (*path[:-1], guess) if guess else None
    return Finding(
        severity,
        dotted(path),
        f"Unknown key in {section}: {reaction}.{hint}",
        "unknown-key",
        fix=_rename_or_remove(path, target, siblings),
    )


def _plain_section(section: str, value: dict[str, Any]) -> list[Finding]:
    read = schema.plain_section_keys(section, value)
    if read is None:
        return []  # DeepSpeed takes the whole dict, or the parse stopped early: cannot tell
    findings: list[Finding] = []
    for key in value:
        if key in read:
            continue
        if is_comment_key(key):
            findings.append(_comment((section, key)))
            continue
        guess = _did_you_mean(key, read)
        hint = f" Did you mean {guess!r}?" if guess else ""
        findings.append(
            Finding(
                Severity.WARNING,
                f"{section}.{key}",
                f"DeepSpeed never reads this key of {section!r}; it is ignored without a warning.{hint}",
                "unknown-key",
                fix=_rename_or_remove((section, key), (section, guess) if guess else None, value),
            )
        )
    return findings


def key_findings(config: dict[str, Any]) -> list[Finding]:
    """Unknown, misplaced and removed keys, top level first, then inside each section."""
    findings: list[Finding] = []
    known = schema.top_level_keys()
    removed = schema.removed_top_level_keys()
    models = schema.section_models()
    for key, value in config.items():
        if key in removed:
            fix = Fix("remove it", (Edit("remove", (key,)),))
            message = f"{removed[key].strip()} (refused by DeepSpeed {_version()})"
            findings.append(Finding(Severity.ERROR, key, message, "removed-key", fix=fix))
        elif key not in known and is_comment_key(key):
            findings.append(_comment((key,)))
        elif key not in known:
            findings.append(_unknown_top_level(config, key))
        elif key in models and isinstance(value, dict):
            findings += _model_section((key,), value, models[key])
        elif isinstance(value, dict):
            findings += _plain_section(key, value)
    return findings
