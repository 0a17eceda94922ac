"""The architecture details that decide activation memory, read from the model's config.json.

A ModelSummary has the shapes; activation memory also depends on which norm the layers use, how the MLP
is built, which activation function (and how transformers implements it) and where dropout runs,
because each of those decides which tensors autograd keeps for the backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.models import ModelSummary

# Config defaults of transformers 5.23 for keys a config.json may omit (dropout probabilities).
_DROPOUT_DEFAULTS: dict[str, dict[str, float]] = {
    "gpt2": {"attn_pdrop": 0.1, "resid_pdrop": 0.1, "embd_pdrop": 0.1},
    "t5": {"dropout_rate": 0.1},
    "bert": {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1},
    "opt": {"dropout": 0.1, "attention_dropout": 0.0},
}
_ATTENTION_DROPOUT_KEYS = ("attn_pdrop", "attention_probs_dropout_prob", "attention_dropout", "dropout_rate")
_HIDDEN_DROPOUT_KEYS = ("resid_pdrop", "hidden_dropout_prob", "hidden_dropout", "dropout", "dropout_rate")
_EMBEDDING_DROPOUT_KEYS = ("embd_pdrop", "hidden_dropout_prob", "hidden_dropout", "dropout", "dropout_rate")

# How many intermediate-sized tensors one activation function keeps for backward, including the output
# that the down projection saves. Counted from the transformers 5.23 / torch 2.13 implementations and
# checked with MemTracker (tests/test_estimate_activations.py):
#   relu: its output only (relu's backward reads the result, which the down projection also saves);
#   gelu / silu (fused torch kernels): input + output;
#   gelu_new (NewGELUActivation, written as python ops): input, 0.5*x, tanh(.), 1 + tanh(.), output.
_ACTIVATION_SAVED_TENSORS = {
    "relu": 1,
    "gelu": 2,
    "gelu_pytorch_tanh": 2,
    "gelu_python": 2,
    "silu": 2,
    "swish": 2,
    "gelu_new": 5,
    "gelu_fast": 5,
    "quick_gelu": 3,
}
# Families whose norm is a python RMSNorm that upcasts to fp32 (Llama, Mistral, Qwen2, T5 ...).
_RMSNORM_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "t5", "mt5", "mixtral", "phi3")
_ROTARY_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gpt_neox", "falcon", "mixtral", "phi3")
_RELATIVE_BIAS_TYPES = ("t5", "mt5")  # learned (heads, s, s) position bias handed to attention as a mask
# Families transformers runs only with its own eager attention, whatever attn_implementation asks: BLOOM has no
# `_supports_sdpa` (transformers 5.23 models/bloom/modeling_bloom.py; the same code in the 4.2x releases of 2023):
# `alibi.baddbmm(q, k)` scores, then `F.softmax(..., dtype=torch.float32).to(dtype)` (modeling_bloom.py:270-283),
# so the fp32 probabilities and their 16-bit copy are kept per score. ALiBi itself is (heads, 1, s), not s^2.
_EAGER_ONLY_TYPES = ("bloom",)
# Eager attention whose softmax runs in fp32 in transformers 5.23 (`softmax(..., dtype=torch.float32).to(dtype)`):
# Llama-style eager_attention_forward, BLOOM, OPT (models/opt/modeling_opt.py:88) and GPT-NeoX
# (models/gpt_neox/modeling_gpt_neox.py:158). Older releases differ per family: estimate/eager_scores.py.
_LLAMA_STYLE_EAGER = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "mixtral", "phi3")
_FP32_SOFTMAX_TYPES = (*_LLAMA_STYLE_EAGER, "bloom", "opt", "gpt_neox")


@dataclass(frozen=True, kw_only=True)
class ArchTraits:
    rmsnorm: bool  # python RMSNorm: keeps an fp32 copy of its input
    gated_mlp: bool  # act(gate(x)) * up(x), as in Llama and T5 v1.1
    activation: str
    activation_saved: int  # intermediate-sized tensors the activation keeps (see table above)
    attention_dropout: float
    hidden_dropout: float
    embedding_dropout: float
    mlp_dropout: bool  # dropout inside the MLP, on the intermediate width (T5 DenseActDense, OPT activation_dropout)
    rotary: bool
    relative_bias: bool  # learned position bias added to the scores (T5); breaks fused attention kernels
    fp32_softmax: bool  # eager attention computes softmax in fp32 (Llama-style eager_attention_forward)
    eager_only: bool = False  # transformers has no fused (sdpa / flash) path for it: see _EAGER_ONLY_TYPES
    model_type: str = ""  # config.json's model_type: eager attention's history is per family (eager_scores.py)


def _first(config: dict[str, Any], defaults: dict[str, float], keys: tuple[str, ...]) -> float:
    for key in keys:
        if key in config and config[key] is not None:
            return float(config[key])
        if key in defaults:
            return defaults[key]
    return 0.0


def _activation(config: dict[str, Any], model_type: str) -> tuple[str, bool]:
    """Activation name and whether the MLP is gated."""
    if model_type in ("t5", "mt5"):
        projection = str(config.get("feed_forward_proj", "relu"))
        gated = projection.startswith("gated-")
        name = projection.removeprefix("gated-")
        return ("gelu_new" if name == "gelu" and gated else name), gated
    name = str(config.get("activation_function") or config.get("hidden_act") or "gelu")
    gated = model_type in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "mixtral", "phi3")
    return name, gated


def traits_of(model: ModelSummary) -> ArchTraits:
    config = model.config
    model_type = model.model_type
    defaults = _DROPOUT_DEFAULTS.get(model_type, {})
    activation, gated = _activation(config, model_type)
    return ArchTraits(
        rmsnorm=model_type in _RMSNORM_TYPES or "rms_norm_eps" in config,
        gated_mlp=gated,
        activation=activation,
        activation_saved=_ACTIVATION_SAVED_TENSORS.get(activation, 2),
        attention_dropout=_first(config, defaults, _ATTENTION_DROPOUT_KEYS),
        hidden_dropout=_first(config, defaults, _HIDDEN_DROPOUT_KEYS),
        embedding_dropout=_first(config, defaults, _EMBEDDING_DROPOUT_KEYS),
        mlp_dropout=(model_type in ("t5", "mt5") and _first(config, defaults, ("dropout_rate",)) > 0)
        or float(config.get("activation_dropout") or 0.0) > 0,
        rotary=model_type in _ROTARY_TYPES,
        relative_bias=model_type in _RELATIVE_BIAS_TYPES or bool(config.get("alibi")),  # Falcon: alibi as an s^2 mask
        fp32_softmax=model_type in _FP32_SOFTMAX_TYPES,
        eager_only=model_type in _EAGER_ONLY_TYPES,
        model_type=model_type,
    )
