"""Turn the user's `--model` into a config dict and architecture, without downloading anything.

Accepted, in this order: a built-in profile name, a local directory holding config.json or a path
to a config.json, a hub id whose config.json is already in the local Hugging Face cache.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import UserError
from autotune.models.bounds import check_bounds, check_known
from autotune.models.profiles import find_profile, model_profiles


@dataclass(frozen=True)
class ModelSource:
    name: str
    origin: str  # "profile" | "local" | "hub-cache"
    config: dict  # raw config.json content, model_type included
    architecture: str | None  # training-head class; None lets the summary choose one
    location: str
    trust_remote_code: bool = False


MAX_CONFIG_BYTES = 16 << 20  # a config.json is kilobytes; anything this large is not one
# Size fields a model is built from: each must be a positive integer when present (a negative or string
# n_embd would otherwise fail deep inside torch, or hang building a huge meta tensor).
SIZE_FIELDS = (
    "hidden_size", "n_embd", "d_model", "num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers",
    "num_attention_heads", "n_head", "num_heads", "num_key_value_heads", "intermediate_size", "n_inner", "d_ff",
    "ffn_dim", "d_kv", "head_dim", "vocab_size", "max_position_embeddings", "n_positions",
)  # fmt: skip


def _read_config_json(path: Path) -> dict:
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES or not path.is_file():
            raise UserError(f"{path} is not a config.json (not a regular file, or larger than 16 MiB)")
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise UserError(f"malformed config.json at {path}: not UTF-8 text") from None
    except RecursionError:
        raise UserError(f"malformed config.json at {path}: nested too deeply") from None
    except json.JSONDecodeError as error:
        raise UserError(f"malformed config.json at {path}: {error.msg} (line {error.lineno})") from None
    if not isinstance(data, dict):
        raise UserError(f"malformed config.json at {path}: expected a JSON object")
    if "model_type" not in data:
        raise UserError(f"unsupported config.json at {path}: it has no 'model_type'")
    check_sizes(data, str(path))
    return data


def check_sizes(config: dict, where: str) -> None:
    """Every size field present is a positive integer (null is allowed: transformers fills a default), within
    the bounds of models/bounds.py."""
    for name in SIZE_FIELDS:
        value = config.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise UserError(f"config.json at {where}: {name} must be a positive integer, got {value!r}")
    check_bounds(config, where)


def _with_code_dir(config: dict, config_path: Path, trust_remote_code: bool) -> dict:
    """A remote-code config (`auto_map`, --trust-remote-code) records the directory its code is in, as
    transformers' `_name_or_path`, so the meta build and the trial workers load the classes from there
    (models/architecture.py); other configs are returned as read."""
    if not (trust_remote_code and "auto_map" in config):
        return config
    return {**config, "_name_or_path": str(config_path.resolve().parent)}


def _read_profile_file(path: Path) -> ModelSource | None:
    """A file in the built-in profile format ({"name", "architecture", "config"}) is accepted as a custom profile."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
            return None  # _read_config_json says why
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # ValueError covers JSONDecodeError and UnicodeDecodeError
        return None
    if not (isinstance(data, dict) and isinstance(data.get("config"), dict) and "model_type" in data["config"]):
        return None
    check_sizes(data["config"], str(path))
    return ModelSource(
        name=str(data.get("name") or path.stem),
        origin="local",
        config=data["config"],
        architecture=data.get("architecture"),
        location=str(path.resolve()),
    )


def _architecture_from(config: dict) -> str | None:
    names = config.get("architectures") or []
    return names[0] if names else None


def _from_local(path: Path, trust_remote_code: bool) -> ModelSource:
    config_path = path / "config.json" if path.is_dir() else path
    if not config_path.is_file():
        raise UserError(f"{path} has no config.json")
    profile = _read_profile_file(config_path)
    if profile is not None:
        return profile
    config = _with_code_dir(_read_config_json(config_path), config_path, trust_remote_code)
    return ModelSource(
        name=path.resolve().name if path.is_dir() else path.resolve().parent.name,
        origin="local",
        config=config,
        architecture=_architecture_from(config),
        location=str(config_path.resolve()),
        trust_remote_code=trust_remote_code,
    )


def _from_hub_cache(repo_id: str, trust_remote_code: bool) -> ModelSource | None:
    if repo_id.count("/") != 1:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        cached = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # huggingface_hub's HFValidationError: `../x`, `org/..` are no repo ids
        return None
    if not isinstance(cached, str):
        return None
    config = _with_code_dir(_read_config_json(Path(cached)), Path(cached), trust_remote_code)
    return ModelSource(
        name=repo_id,
        origin="hub-cache",
        config=config,
        architecture=_architecture_from(config),
        location=cached,
        trust_remote_code=trust_remote_code,
    )


def resolve_model(spec: str, trust_remote_code: bool = False) -> ModelSource:
    text = spec.strip()
    if not text:
        raise UserError("--model is empty")
    profile = find_profile(text)
    if profile is not None:
        return ModelSource(
            name=profile.name,
            origin="profile",
            config=dict(profile.config),
            architecture=profile.architecture,
            location=str(profile.path),
        )
    if "\0" in text:
        raise UserError("--model contains a NUL byte")
    try:
        path = Path(text).expanduser()
        exists = path.exists()
    except RuntimeError:  # `~nosuchuser/x`: no home directory to expand
        path, exists = Path(text), False
    except OSError as error:  # ENAMETOOLONG and kin: no such path, and no repo id either
        shown = text if len(text) <= 80 else f"{text[:80]}..."
        raise UserError(f"--model {shown!r}: {error.strerror or error}") from None
    found = _from_local(path, trust_remote_code) if exists else _from_hub_cache(text, trust_remote_code)
    if found is not None:
        check_known(found.config, found.location, trust_remote_code=trust_remote_code)
        return found
    names = sorted(p.name for p in model_profiles().values())
    close = difflib.get_close_matches(text.lower(), names, n=3, cutoff=0.4)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise UserError(
        f"unknown model {text!r}{hint} (not a built-in profile, a local path, or a hub id in the local HF cache;"
        " see `autotune model --list`)"
    )
