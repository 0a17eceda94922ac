"""The model summary: the numbers the memory model needs, as a plain value (no torch, no transformers).

Kept apart from summary.py (which builds summaries) so that the shipped summaries (shipped.py) can be read
without importing the builder: summary.py -> shipped.py -> types.py, no cycle.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True, kw_only=True)
class ModelSummary:
    name: str
    origin: str
    architecture: str
    model_type: str
    family: str  # "decoder-only" | "encoder-decoder" | "encoder"
    total_params: int
    trainable_params: int
    largest_layer_params: int  # most parameters owned directly by one module (DeepSpeed's definition)
    embedding_params: int
    hidden_size: int
    num_layers: int  # encoder layers for encoder-decoder models
    num_decoder_layers: int  # 0 for decoder-only and encoder-only models
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_positions: int | None
    tied_embeddings: bool
    fingerprint: str
    config: dict = field(repr=False)
    trust_remote_code: bool = False

    @property
    def total_layers(self) -> int:
        return self.num_layers + self.num_decoder_layers

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelSummary:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


def fingerprint(config: dict, architecture: str | None) -> str:
    canonical = {k: v for k, v in config.items() if k not in ("transformers_version", "_name_or_path")}
    blob = json.dumps({"architecture": architecture, "config": canonical}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
