"""Bounds on a model config, checked before transformers is imported (issue 46).

A hostile or mistyped config.json used to reach transformers before anything looked at its sizes: `"n_layer":
1000000000000` ran `plan` past 180 s (the meta-device build makes a Python module per layer), and an unknown
`model_type` or `architectures: ["pipeline"]` took 31-97 s under load to be refused, all of it importing
transformers and torch. These checks read only the dict and transformers' own source text, so they answer in
milliseconds. Each bound is far above any published model, with its reason beside it:

- MAX_LAYERS: the deepest published transformer has 1,000 layers (DeepNet, Wang et al. 2022, arXiv 2203.00555);
  10x that. Building on the meta device costs about 9 ms a layer here (tiny GPT-2 blocks, 3,000 layers in
  27.9 s at load 12.4, our measurement), so 10,000 layers are still built, in minutes at most.
- MAX_WIDTH: the widest published dense model, PaLM 540B, has d_model 18,432 (Chowdhery et al. 2022, Table 1);
  2^20 is 56x that, and one square weight at this width is already 1.1e12 parameters.
- MAX_PARAMETERS: DeepSpeed's largest reported trainable size is 32 trillion parameters (ZeRO-Infinity,
  Rajbhandari et al. 2021, on 32 DGX-2 nodes); 1e14 is 3x that, 1.6 PB of mixed-precision Adam model states
  at 16 bytes a parameter (ZeRO, Rajbhandari et al. 2020, section 3.1).

The parameter count here is an upper-side estimate from the config alone (per layer 4h^2 attention plus
3*h*ff for a gated MLP, the larger of the two MLP kinds, plus vocabulary and learned positions times h); it only
has to tell absurd from possible, the real count comes from the meta build (models/model_summary.py).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from functools import lru_cache
from pathlib import Path

from autotune.errors import UserError

MAX_LAYERS = 10_000
MAX_WIDTH = 1 << 20
MAX_PARAMETERS = 10**14

LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers")  # the first present is the (encoder) stack
DECODER_LAYER_FIELDS = ("num_decoder_layers",)
HIDDEN_FIELDS = ("hidden_size", "n_embd", "d_model")
FF_FIELDS = ("intermediate_size", "n_inner", "d_ff", "ffn_dim")
WIDTH_FIELDS = (*HIDDEN_FIELDS, *FF_FIELDS, "num_attention_heads", "n_head", "num_heads", "num_key_value_heads",
                "d_kv", "head_dim")  # fmt: skip
TABLE_FIELDS = ("vocab_size", "max_position_embeddings", "n_positions")  # rows of an embedding table, times h

# A Python class name in transformers' head naming (`GPT2LMHeadModel`, `LlamaForCausalLM`, `T5Model`): an
# `architectures` entry that is not one (`pipeline`, `AutoConfig`) names no model and is refused, where
# getattr(transformers, name)(config) would have called whatever it names.
ARCHITECTURE_NAME = re.compile(r"^[A-Z][A-Za-z0-9_]*(Model|For[A-Za-z0-9_]+)$")


def _first_int(config: dict, names: tuple[str, ...]) -> int:
    value = next((config[name] for name in names if isinstance(config.get(name), int)), 0)
    return int(value)


def estimated_parameters(config: dict) -> int:
    """An upper-side parameter count from the config's sizes alone (module docstring); 0 when it has none."""
    layers = _first_int(config, LAYER_FIELDS) + _first_int(config, DECODER_LAYER_FIELDS)
    hidden = _first_int(config, HIDDEN_FIELDS)
    ff = _first_int(config, FF_FIELDS) or 4 * hidden
    tables = sum(int(config[name]) for name in TABLE_FIELDS if isinstance(config.get(name), int))
    return layers * (4 * hidden * hidden + 3 * hidden * ff) + tables * hidden


def check_bounds(config: dict, where: str) -> None:
    """Layers, widths and the estimated parameter count are within the bounds above; else one line."""
    layers = _first_int(config, LAYER_FIELDS) + _first_int(config, DECODER_LAYER_FIELDS)
    if layers > MAX_LAYERS:
        raise UserError(
            f"config.json at {where}: {layers:,} layers; autotune builds at most {MAX_LAYERS:,}"
            " (10x the deepest published transformer)"
        )
    for name in WIDTH_FIELDS:
        value = config.get(name)
        if isinstance(value, int) and value > MAX_WIDTH:
            raise UserError(
                f"config.json at {where}: {name} {value:,} is above {MAX_WIDTH:,} (56x the widest published model)"
            )
    if (count := estimated_parameters(config)) > MAX_PARAMETERS:
        raise UserError(
            f"config.json at {where}: about {count:.2g} parameters, above {MAX_PARAMETERS:.0e}"
            " (3x the largest model DeepSpeed reports training)"
        )


@lru_cache(maxsize=1)
def transformers_names() -> frozenset[str] | None:
    """Every string literal in transformers' auto-mapping sources (model types and class names among them),
    read as text without importing transformers; None when this transformers lays them out elsewhere."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        return None
    auto = Path(spec.origin).parent / "models" / "auto"
    names: set[str] = set()
    for file in ("auto_mappings.py", "configuration_auto.py", "modeling_auto.py"):
        try:
            tree = ast.parse((auto / file).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            continue
        names.update(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return frozenset(names) if names else None


def check_known(config: dict, where: str, *, trust_remote_code: bool) -> None:
    """The model type is one transformers knows and the architecture names a model class, before importing it.

    A config with `auto_map` under --trust-remote-code brings its own classes, so neither is asked of it."""
    if trust_remote_code and "auto_map" in config:
        return
    for name in config.get("architectures") or []:
        if not isinstance(name, str) or not ARCHITECTURE_NAME.match(name):
            raise UserError(f"config.json at {where}: architectures entry {name!r} names no model class")
    model_type = config.get("model_type")
    known = transformers_names()
    if known is not None and (not isinstance(model_type, str) or model_type not in known):
        raise UserError(
            f"unsupported model_type {model_type!r} in config.json at {where}: the installed transformers does not"
            " know it (a model with its own code needs --trust-remote-code and an auto_map)"
        )
