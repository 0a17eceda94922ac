"""Instantiate a real transformers architecture from a config dict (shared by the summary and trial workers)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from autotune.errors import UserError

_ENCODER_HEADS = ("ForMaskedLM", "ForPreTraining", "ForSequenceClassification", "ForTokenClassification")


def make_config(config: dict, trust_remote_code: bool = False) -> Any:
    import transformers

    # A deep copy: transformers normalises nested values in place (rope_scaling, for Llama 3.2), which would
    # change the caller's config and so its fingerprint after the build.
    skipped = ("transformers_version", "torch_dtype", "dtype")
    values = copy.deepcopy({k: v for k, v in config.items() if k not in skipped})
    model_type = values.pop("model_type", None)
    if model_type is None:
        raise UserError("config has no 'model_type'")
    if "auto_map" in values and trust_remote_code:
        return _remote_code_config(config)
    try:
        return transformers.AutoConfig.for_model(model_type, **values)
    except ValueError as error:
        first = str(error).splitlines()[0]
        raise UserError(f"unsupported model_type {model_type!r}: {first}") from None


def _remote_code_config(config: dict) -> Any:
    """A config whose classes live in the model's own directory (`auto_map`, --trust-remote-code): loaded from that
    directory, which models/resolve.py records as `_name_or_path` (transformers' own key for where a config came
    from, and where AutoModel*.from_config looks for the modeling code); no network is needed for a local one."""
    import transformers

    code_dir = config.get("_name_or_path")
    if not isinstance(code_dir, str) or not Path(code_dir, "config.json").is_file():
        raise UserError("remote-code configs are only supported from a local directory or the HF cache")
    try:
        return transformers.AutoConfig.from_pretrained(code_dir, trust_remote_code=True)
    except (OSError, ValueError, ImportError, AttributeError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(f"cannot load the remote-code config in {code_dir}: {first}") from None


def choose_architecture(config: Any, requested: str | None) -> str:
    """The training head to build: the config's own architecture if transformers has it, else an auto head."""
    import transformers
    from transformers.models.auto import modeling_auto as auto

    if requested and hasattr(transformers, requested):
        return requested
    model_type = config.model_type
    for mapping in (
        auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    ):
        if model_type in mapping and not (
            config.is_encoder_decoder and mapping is auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        ):
            return mapping[model_type]
    raise UserError(f"unsupported model_type {model_type!r}: transformers has no language-model head for it")


def family_of(config: Any, architecture: str) -> str:
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    if architecture.endswith(_ENCODER_HEADS):
        return "encoder"
    return "decoder-only"


def build_model(
    config_dict: dict,
    architecture: str | None,
    device: str = "meta",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> tuple[Any, str]:
    """Build the model on `device` ("meta" allocates nothing) and return it with its class name."""
    import torch
    import transformers

    config = make_config(config_dict, trust_remote_code)
    if attn_implementation:
        config._attn_implementation = attn_implementation
    if trust_remote_code and "auto_map" in config_dict:
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=True)
        return model, type(model).__name__
    name = choose_architecture(config, architecture)
    model_class = getattr(transformers, name)
    try:
        with torch.device(device):
            model = model_class(config)
    except (ValueError, TypeError, AttributeError) as error:
        raise UserError(f"cannot build {name} from this config: {error}") from None
    return model, name
