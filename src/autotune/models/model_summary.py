"""ModelSummary: exact sizes of a real architecture, counted on the meta device.

Summaries are cached on disk by config fingerprint and transformers version, so `plan` does not pay
for importing transformers on every call.
"""

from __future__ import annotations

import contextlib
import json
import logging
from importlib import metadata
from pathlib import Path
from typing import Any

from autotune.errors import UserError
from autotune.infra.atomic import atomic_write_json
from autotune.infra.paths import cache_dir
from autotune.infra.sharing import path_distrust_reason
from autotune.models.model_types import ModelSummary, fingerprint
from autotune.models.resolve import ModelSource

SUMMARY_SCHEMA = 1
log = logging.getLogger(__name__)


def _first(config: Any, names: tuple[str, ...], default: Any = None) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def summarize_model(model: Any, source: ModelSource, architecture: str) -> ModelSummary:
    from autotune.models.architecture import family_of

    config = model.config
    family = family_of(config, architecture)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    embedding = model.get_input_embeddings().weight.numel()
    hidden = int(_first(config, ("hidden_size", "d_model", "n_embd")))
    heads = int(_first(config, ("num_attention_heads", "num_heads", "n_head")))
    kv_heads = _first(config, ("num_key_value_heads", "num_kv_heads"))
    if kv_heads is None:
        kv_heads = 1 if getattr(config, "multi_query", False) else heads
    head_dim = int(_first(config, ("head_dim", "d_kv"), hidden // heads))
    encoder_layers = int(_first(config, ("num_hidden_layers", "num_layers", "n_layer")))
    decoder_layers = int(_first(config, ("num_decoder_layers",), encoder_layers)) if family == "encoder-decoder" else 0
    output = model.get_output_embeddings()
    tied = output is not None and output.weight is model.get_input_embeddings().weight
    return ModelSummary(
        name=source.name,
        origin=source.origin,
        architecture=architecture,
        model_type=config.model_type,
        family=family,
        total_params=total,
        trainable_params=trainable,
        largest_layer_params=largest,
        embedding_params=embedding,
        hidden_size=hidden,
        num_layers=encoder_layers,
        num_decoder_layers=decoder_layers,
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=head_dim,
        intermediate_size=int(
            _first(config, ("intermediate_size", "ffn_dim", "d_ff", "n_inner", "ffn_hidden_size"), 4 * hidden)
        ),
        vocab_size=int(config.vocab_size),
        max_positions=_first(config, ("max_position_embeddings", "n_positions", "seq_length")),
        tied_embeddings=tied,
        fingerprint=fingerprint(source.config, source.architecture),
        config=source.config,
        trust_remote_code=source.trust_remote_code,
    )


def _cache_path(source: ModelSource) -> Path:
    try:
        version = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        version = "unknown"
    key = fingerprint(source.config, source.architecture)
    return cache_dir() / "models" / f"v{SUMMARY_SCHEMA}-{key}-tf{version}.json"


def summarize(source: ModelSource, use_cache: bool = True) -> ModelSummary:
    """Summary of `source`: from the disk cache when this exact config was built before, from the summaries
    shipped with the built-in profiles, else from a meta-device build (which imports torch and transformers)."""
    path = _cache_path(source)
    if use_cache and (cached := _cached_summary(path, source)) is not None:
        return cached if cached.name == source.name else _renamed(cached, source)
    if use_cache:
        from autotune.models.shipped import shipped_summary

        if (shipped := shipped_summary(source)) is not None:
            return shipped
    from autotune.models.architecture import build_model

    try:
        model, architecture = build_model(source.config, source.architecture, "meta", source.trust_remote_code)
    except UserError:
        raise
    except Exception as error:  # transformers and torch refuse bad configs in many ways; all are the user's input
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(f"cannot build {source.name} from its config: {type(error).__name__}: {first}") from None
    summary = summarize_model(model, source, architecture)
    if use_cache:
        with contextlib.suppress(OSError):  # a read-only cache dir only costs speed
            atomic_write_json(path, summary.to_dict())
    return summary


def _cached_summary(path: Path, source: ModelSource) -> ModelSummary | None:
    """The summary stored for `source`, when this user (or the shared group) wrote it and it describes this very
    config with numbers a model could have; else None (with one line saying why), and the summary is rebuilt."""
    if not path.is_file() and not path.is_symlink():
        return None
    why = path_distrust_reason(path)
    if why is None:
        try:
            cached = ModelSummary.from_dict(json.loads(path.read_text()))
            why = implausible_summary(cached, source)
        except (OSError, ValueError, KeyError, TypeError) as error:
            why = f"unreadable or malformed ({type(error).__name__})"
    if why is None:
        return cached
    log.warning("autotune: ignored cached model summary %s: %s; rebuilding it", path, why)
    with contextlib.suppress(OSError):
        path.unlink()
    return None


def implausible_summary(summary: ModelSummary, source: ModelSource) -> str | None:
    """Why a stored summary cannot be this model's, or None: it must be of this config, and its counts must
    hold together (every token has an embedding row, parts are no larger than the whole)."""
    if summary.fingerprint != fingerprint(source.config, source.architecture):
        return "it describes another config"
    counts = (summary.trainable_params, summary.largest_layer_params, summary.embedding_params)
    if summary.total_params < max(summary.vocab_size, 1) or any(
        not 0 <= part <= summary.total_params for part in counts
    ):
        return f"its parameter counts do not hold together (total {summary.total_params}, parts {counts})"
    if min(summary.hidden_size, summary.num_layers + summary.num_decoder_layers, summary.num_heads) < 1:
        return "it has no layers, heads or hidden size"
    return None


def _renamed(summary: ModelSummary, source: ModelSource) -> ModelSummary:
    data = summary.to_dict()
    data.update(name=source.name, origin=source.origin)
    return ModelSummary.from_dict(data)
