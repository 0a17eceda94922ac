"""Read a config file the way its consumer does, and refuse hostile input with one clear line.

DeepSpeed reads its config with hjson (comments and trailing commas load); HF Trainer and accelerate
read it with `json.load` (accelerate/utils/deepspeed.py, HfDeepSpeedConfig.__init__), which rejects
comments and a byte-order mark. Both verdicts are kept so the consumer check can use the right one.
An accelerate YAML config (`accelerate config` output) is read too: its `deepspeed_config` section
names a `deepspeed_config_file` or holds the DeepSpeed settings inline.
"""

from __future__ import annotations

import json
import math
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.errors import UserError

MAX_CONFIG_BYTES = 16 * 1024 * 1024  # published ds_configs are a few KiB; /dev/zero must not be read forever
MAX_DEPTH = 32  # the deepest DeepSpeed section is 3 levels down; anything deeper is not a config
# Keys in the whole file: the largest file in our corpus (tests/data/check/corpus) has 241, a real ds_config 20-50.
# 700k keys took `check` past 300 s and 1.6 GB (a finding, a did-you-mean and a table row each); refused instead.
MAX_KEYS = 4096
HJSON_SEPARATORS_PER_KEY = 4  # slack for ':' inside strings (URLs, times, paths) before a file counts as too many keys
INT64_DIGITS = 19  # 2**63 - 1 has 19 digits; no DeepSpeed setting holds more
_YAML_SUFFIXES = (".yaml", ".yml")


@dataclass
class AccelerateYaml:
    """What an accelerate YAML says about the DeepSpeed run (accelerate/commands/config/config_args.py)."""

    path: str
    deepspeed_config_file: str | None  # the ds_config it points at, resolved; None when inline
    mixed_precision: str = "no"
    num_processes: int | None = None
    inline: dict[str, Any] = field(default_factory=dict)  # the `deepspeed_config` section as written


@dataclass
class LoadedConfig:
    config: dict[str, Any]
    duplicate_keys: list[str] = field(default_factory=list)  # DeepSpeed refuses a file with these
    strict_json_problem: str = ""  # why json.load (HF, accelerate) refuses the file; "" when it loads
    # NaN/Infinity values: (dotted key path, literal, what DeepSpeed's own file reader makes of the file)
    nonfinite: list[tuple[str, str, str]] = field(default_factory=list)
    accelerate: AccelerateYaml | None = None  # set when the file given was an accelerate YAML
    source_path: str = ""  # the file the DeepSpeed settings came from


def read_text_safely(path: str | Path, what: str = "config") -> str:
    """The file's text; UserError for a directory, a FIFO or device, an oversized or undecodable file."""
    source = Path(path)
    try:
        info = source.stat()
    except FileNotFoundError:
        raise UserError(f"{what} file not found: {source}") from None
    except OSError as error:
        raise UserError(f"cannot read {what} {source}: {error.strerror or error}") from None
    if stat.S_ISDIR(info.st_mode):
        raise UserError(f"{what} path is a directory, not a file: {source}")
    if not stat.S_ISREG(info.st_mode):
        raise UserError(f"{what} path is not a regular file (a FIFO, socket or device): {source}")
    if info.st_size > MAX_CONFIG_BYTES:
        raise UserError(f"{what} {source} is {info.st_size:,} bytes; a DeepSpeed config is a few KiB")
    try:
        with open(source, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise UserError(f"cannot read {what} {source}: {error.strerror or error}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise UserError(f"{what} {source} is larger than {MAX_CONFIG_BYTES:,} bytes; a DeepSpeed config is a few KiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UserError(f"{what} {source} is not UTF-8 text: {error.reason} at byte {error.start}") from None
    if not text.strip():
        raise UserError(f"{what} {source} is empty")
    return text


def _shape(value: Any) -> tuple[int, int]:
    """(nesting depth, number of keys), iteratively (a recursive walk is what hostile nesting would break)."""
    deepest, keys, stack = 0, 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children = list(node.values())
            keys += len(node)
        elif isinstance(node, list):
            children = list(node)
        else:
            continue
        deepest = max(deepest, level)
        if level > MAX_DEPTH:
            return level, keys
        stack.extend((child, level + 1) for child in children)
    return deepest, keys


_UNREAD = object()
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}  # json.loads' parse_constant names


def _nonfinite_paths(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted path, literal) of every NaN/Infinity float in a config json.loads read."""
    if isinstance(value, dict):
        return [found for key, child in value.items() for found in _nonfinite_paths(child, f"{prefix}{key}.")]
    if isinstance(value, list):
        return [found for i, child in enumerate(value) for found in _nonfinite_paths(child, f"{prefix}{i}.")]
    if isinstance(value, float) and not math.isfinite(value):
        literal = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        return [(prefix.rstrip("."), literal)]
    return []


def deepspeed_file_reading(text: str) -> str:
    """What DeepSpeed does with a file holding NaN/Infinity: given a path, it reads it with hjson.load
    (deepspeed/runtime/config.py:444 in 0.19.8), where NaN and Infinity are no numbers but quoteless strings that
    run to the end of the line, so `"x": NaN, "y": 1` on one line is refused and `"x": NaN,` alone on its line
    becomes the string 'NaN,'. Given a dict (HF Trainer and accelerate json.load the file first) it gets json's
    floats."""
    import hjson

    try:
        read = hjson.loads(text.lstrip("\ufeff"))
    except hjson.HjsonDecodeError as error:
        return f"DeepSpeed given the file's path (hjson.load) refuses it: {error}"
    except RecursionError:
        return "DeepSpeed given the file's path (hjson.load) cannot read it: nested too deeply"
    strings = sorted({repr(v) for _, v in _strings_like_constants(read)})
    return f"DeepSpeed given the file's path (hjson.load) reads {', '.join(strings) or 'them'} as strings"


def _strings_like_constants(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(value, dict):
        return [found for key, child in value.items() for found in _strings_like_constants(child, f"{prefix}{key}.")]
    if isinstance(value, list):
        return [found for i, child in enumerate(value) for found in _strings_like_constants(child, f"{prefix}{i}.")]
    if isinstance(value, str) and value.strip().rstrip(",").lstrip("-") in ("NaN", "Infinity"):
        return [(prefix.rstrip("."), value)]
    return []


def _number_readers(source: Path) -> dict[str, Any]:
    """parse_int / parse_float for json and hjson: numbers DeepSpeed's own hjson.load cannot read are refused
    with one line (a 5000-digit integer passes CPython's int limit, 1e400 overflows hjson's int(res)), and
    integral floats below 1e10 become ints as hjson makes them (hjson/decoder.py, scantfnns)."""

    def read_int(text: str) -> int:
        if len(text.lstrip("-")) > INT64_DIGITS or abs(value := int(text)) >= 1 << 63:
            raise UserError(f"{source}: the integer {text[:24]}... ({len(text)} digits) is beyond 64 bits")
        return value

    def read_float(text: str) -> float | int:
        value = float(text)
        if not math.isfinite(value):
            raise UserError(f"{source}: the number {text[:24]} is beyond a float's range (DeepSpeed cannot read it)")
        return int(value) if value.is_integer() and abs(value) < 1e10 else value

    return {"parse_int": read_int, "parse_float": read_float}


def _parse(text: str, source: Path) -> tuple[dict[str, Any], list[str], str]:
    """(config, duplicate keys, why json.loads refuses it or ""): strict JSON through the C parser first (a
    14 MB file in about a second), hjson (pure Python, DeepSpeed's reader) only for what JSON refuses."""
    import hjson

    duplicates: list[str] = []

    def keep_last(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                duplicates.append(key)
            result[key] = value
        return result

    readers = _number_readers(source)
    config: Any = _UNREAD
    problem = ""
    try:  # NaN/Infinity read as json.load reads them (HF Trainer, accelerate); check says what DeepSpeed does
        config = json.loads(text, object_pairs_hook=keep_last, parse_constant=NONFINITE.__getitem__, **readers)
    except json.JSONDecodeError as error:
        problem = f"{error.msg} (line {error.lineno}, column {error.colno})"
    except RecursionError:
        problem = "nested too deeply"
    if config is _UNREAD:
        duplicates.clear()
        _refuse_before_hjson(text, source)
        try:
            config = hjson.loads(text.lstrip("\ufeff"), object_pairs_hook=keep_last, **readers)
        except hjson.HjsonDecodeError as error:
            raise UserError(f"{source} is not valid JSON or hjson: {error}") from None
        except RecursionError:
            raise UserError(f"{source} is nested too deeply to be a DeepSpeed config") from None
    _check_shape(config, source)
    return config, duplicates, problem


def _refuse_before_hjson(text: str, source: Path) -> None:
    """hjson reads about 0.7 MB/s here (a 14 MB file: 21 s on a loaded 2-core machine): a file with room for far
    more keys than MAX_KEYS (every key needs a ':') is refused before it is parsed."""
    separators = text.count(":")
    if separators > HJSON_SEPARATORS_PER_KEY * MAX_KEYS:
        raise UserError(
            f"{source} has {separators:,} ':' separators, room for far more than {MAX_KEYS:,} keys;"
            " a DeepSpeed config has tens"
        )


def _check_shape(config: Any, source: Path) -> None:
    if not isinstance(config, dict):
        raise UserError(f"{source} must hold a JSON object at the top level, found {type(config).__name__}")
    depth, keys = _shape(config)
    if depth > MAX_DEPTH:
        raise UserError(f"{source} is nested too deeply (nested more than {MAX_DEPTH} levels; a config has 4)")
    if keys > MAX_KEYS:
        raise UserError(f"{source} has {keys:,} keys; a DeepSpeed config has tens, over {MAX_KEYS:,} is refused")


def _load_yaml(text: str, source: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"{source} is not valid YAML: {first}") from None
    except RecursionError:
        raise UserError(f"{source} is nested too deeply to be an accelerate config") from None


def _load_accelerate_yaml(text: str, source: Path) -> LoadedConfig:
    data = _load_yaml(text, source)
    _check_shape(data, source)
    section = data.get("deepspeed_config")
    if data.get("distributed_type") not in (None, "DEEPSPEED") or not isinstance(section, dict):
        raise UserError(f"{source} is an accelerate config without DeepSpeed (no deepspeed_config section)")
    processes = data.get("num_processes")
    info = AccelerateYaml(
        path=str(source),
        deepspeed_config_file=None,
        mixed_precision=str(data.get("mixed_precision") or "no"),
        num_processes=processes if isinstance(processes, int) and not isinstance(processes, bool) else None,
        inline=dict(section),
    )
    named = section.get("deepspeed_config_file")
    if named:
        # accelerate passes the path on as given, so it is relative to the launch directory; a path
        # relative to the YAML is tried second, for configs kept next to their ds_config.
        candidates = [Path(str(named)), source.parent / str(named)]
        target = next((c for c in candidates if c.exists()), candidates[0])
        info.deepspeed_config_file = str(target)
        loaded = _load_deepspeed_json(target)
        loaded.accelerate = info
        return loaded
    return LoadedConfig(config=_inline_deepspeed_config(section), accelerate=info, source_path=str(source))


def _inline_deepspeed_config(section: dict[str, Any]) -> dict[str, Any]:
    """The ds_config accelerate builds from inline YAML settings (DeepSpeedPlugin.__post_init__, else-branch)."""
    offload_optimizer = section.get("offload_optimizer_device", "none")
    offload_param = section.get("offload_param_device", "none")
    config: dict[str, Any] = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": section.get("gradient_accumulation_steps", 1),
        "zero_optimization": {
            "stage": section.get("zero_stage", 2),
            "offload_optimizer": {
                "device": offload_optimizer,
                "nvme_path": section.get("offload_optimizer_nvme_path") if offload_optimizer == "nvme" else None,
            },
            "offload_param": {
                "device": offload_param,
                "nvme_path": section.get("offload_param_nvme_path") if offload_param == "nvme" else None,
            },
        },
    }
    if config["zero_optimization"]["stage"] == 3:
        # accelerate writes this key at every stage; below stage 3 it is inert and not the user's to remove,
        # so it is left out rather than reported.
        save_16bit = bool(section.get("zero3_save_16bit_model", False))
        config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = save_16bit
    clipping = section.get("gradient_clipping")
    if clipping:
        config["gradient_clipping"] = clipping
    return config


def _load_deepspeed_json(source: Path) -> LoadedConfig:
    text = read_text_safely(source)
    config, duplicates, strict_problem = _parse(text, source)
    found = _nonfinite_paths(config)
    reading = deepspeed_file_reading(text) if found else ""
    return LoadedConfig(
        config=config, duplicate_keys=duplicates, strict_json_problem=strict_problem, source_path=str(source),
        nonfinite=[(path, literal, reading) for path, literal in found],
    )  # fmt: skip


def load_config(path: str | Path) -> LoadedConfig:
    """Parse `path`; raise UserError (exit 2) when it cannot be read or is not a config.

    Duplicate keys are kept (last one wins) and reported, instead of failing the read the way
    DeepSpeed's own loader does, so the user sees every other finding too.
    """
    source = Path(path)
    if source.suffix.lower() in _YAML_SUFFIXES:
        return _load_accelerate_yaml(read_text_safely(source, "accelerate config"), source)
    return _load_deepspeed_json(source)


def section_of(config: dict[str, Any], key: str) -> dict[str, Any]:
    """`config[key]` when it is a section (a dict: the very one, not a copy), else an empty dict, so a missing or
    malformed section reads as one that sets nothing."""
    value = config.get(key)
    return value if isinstance(value, dict) else {}
