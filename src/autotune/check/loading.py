"""Read a config file the way DeepSpeed does: hjson, so comments and trailing commas load."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.errors import UserError


@dataclass
class LoadedConfig:
    config: dict[str, Any]
    duplicate_keys: list[str] = field(default_factory=list)  # DeepSpeed refuses a file with these


def load_config(path: str | Path) -> LoadedConfig:
    """Parse `path`; raise UserError (exit 2) when it cannot be read or is not a JSON/hjson object.

    Duplicate keys are kept (last one wins) and reported, instead of failing the read the way
    DeepSpeed's own loader does, so the user sees every other finding too.
    """
    import hjson

    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"config file not found: {source}") from None
    except IsADirectoryError:
        raise UserError(f"config path is a directory, not a file: {source}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read config {source}: {error}") from None

    duplicates: list[str] = []

    def keep_last(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                duplicates.append(key)
            result[key] = value
        return result

    try:
        config = hjson.loads(text, object_pairs_hook=keep_last)
    except hjson.HjsonDecodeError as error:
        raise UserError(f"{source} is not valid JSON or hjson: {error}") from None
    if not isinstance(config, dict):
        raise UserError(f"{source} must hold a JSON object at the top level, found {type(config).__name__}")
    return LoadedConfig(config=config, duplicate_keys=duplicates)
