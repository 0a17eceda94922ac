"""Fused training kernels that replace transformers' stock modules, and what each keeps for backward.

A user who trains with Liger Kernel or flash-attn's fused ops keeps fewer activations than the stock modules
estimate/activations.py counts; each figure is read from the kernel's `ctx.save_for_backward` at a named version
(RMSNorm, SwiGLU/GeGLU, rotary, cross-entropy, fused linear cross-entropy).

Reasoning and sources: estimate/README.md#kernels
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.core.choices import KERNELS, Kernels, is_one_of
from autotune.estimate.pinned import power_of_two_ceil
from autotune.models import ModelSummary

# Model types HF's `use_liger_kernel=True` patches among those estimate/traits.py knows: Liger 0.8.5
# transformers/monkey_patch.py:3904-3958 MODEL_TYPE_TO_APPLY_LIGER_FN; for the rest Liger changes nothing.
LIGER_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "mixtral", "phi3")
RSTD_BYTES = 4  # one fp32 rstd per token (rms_norm.py:466, layernorm.py:204)
LOSS_PER_TOKEN_BYTES = 4  # the fp32 per-token loss of the fused losses (fused_linear_cross_entropy.py:125)


@dataclass(frozen=True)
class FusedKernels:
    """Which fused kernels a kernel set turns on, by what they change in the activation count."""

    name: str
    rms_norm: bool  # the norm keeps its 16-bit input and an fp32 rstd per token
    gated_mlp_tensors: int | None  # intermediate-width tensors a gated MLP keeps; None: stock
    loss: str  # "stock", "cross_entropy" (fused CE on the logits) or "linear_cross_entropy" (no logits)
    model_types: tuple[str, ...] | None = None  # the families it patches; None: any RMSNorm + gated-MLP decoder

    def applies_to(self, model: ModelSummary, rmsnorm: bool, gated_mlp: bool) -> bool:
        if self.name == "stock" or model.family != "decoder-only":
            return False
        if self.model_types is not None:
            return model.model_type in self.model_types
        return rmsnorm and gated_mlp


_SETS: dict[Kernels, FusedKernels] = {  # one per autotune.core.choices.KERNELS (tests/test_estimate_kernels.py)
    "stock": FusedKernels("stock", rms_norm=False, gated_mlp_tensors=None, loss="stock"),
    # HF Trainer use_liger_kernel=True: apply_liger_kernel_to_llama's defaults (monkey_patch.py:259-264): rope,
    # fused_linear_cross_entropy, rms_norm, swiglu on; cross_entropy off.
    "liger": FusedKernels(
        "liger", rms_norm=True, gated_mlp_tensors=3, loss="linear_cross_entropy", model_types=LIGER_MODEL_TYPES
    ),
    # whyNLP/tinyllama tinyllama/__init__.py: flash-attn's triton RMSNorm, flash-attn's CrossEntropyLoss, flash-attn's
    # rotary, xformers' fused SwiGLU.
    "flash-attn-fused": FusedKernels("flash-attn-fused", rms_norm=True, gated_mlp_tensors=2, loss="cross_entropy"),
}


def fused_kernels(name: str) -> FusedKernels:
    """The kernel set called `name` (one of autotune.core.choices.KERNELS); ValueError for any other name."""
    if not is_one_of(name, KERNELS):
        raise ValueError(f"kernels must be one of {', '.join(KERNELS)}, got {name!r}")
    return _SETS[name]


_NOTES = {
    "liger": "activations counted for Liger's kernels (fused RMSNorm and SwiGLU keep less; the fused linear"
    " cross-entropy keeps a logits chunk and the hidden states' gradient instead of the full logits); Liger"
    " changes only the model types it patches (llama, mistral, qwen2/3, gemma/gemma2, mixtral, phi3)",
    "flash-attn-fused": "activations counted for flash-attn's fused RMSNorm and cross-entropy and xformers' fused"
    " SwiGLU (decoder models with RMSNorm and a SiLU-gated MLP)",
}


def kernels_note(name: str) -> str | None:
    """One line for a plan or report saying which kernels the prediction counts; None for stock modules."""
    return _NOTES.get(name)


def linear_cross_entropy_chunk_rows(tokens: int, vocab: int, hidden: int) -> int:
    """Rows of one logits chunk: Liger 0.8.5 fused_linear_cross_entropy.py:103-105 with chunk_mem_const 1."""
    inc_factor = -(-vocab // hidden)
    rows = -(-tokens // inc_factor)
    return min(power_of_two_ceil(rows), tokens)


@dataclass(frozen=True)
class LossChunk:
    """The one logits chunk of a fused linear cross-entropy: its rows depend on the whole micro-batch's tokens,
    rounded to a power of two, so it is not a per-sample figure."""

    tokens_per_sample: int
    vocab: int
    hidden: int
    element_bytes: int

    def bytes(self, micro_batch: int) -> int:
        rows = linear_cross_entropy_chunk_rows(self.tokens_per_sample * micro_batch, self.vocab, self.hidden)
        return rows * self.vocab * self.element_bytes
