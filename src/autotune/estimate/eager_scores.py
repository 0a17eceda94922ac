"""What eager attention keeps per s^2 score element, by family and transformers version.

Eager attention keeps the softmax output for its backward and the (dropped-out) probabilities for the
value matmul. Whether the softmax runs in fp32 (keeping a 4-byte output plus its 16-bit copy) changed over
transformers releases, family by family, and OPT's attention before 4.49 also clamped the masked scores
with `torch.max`, whose backward keeps its 16-bit input. The history below was read from the released
wheels (file:line) and measured with autograd's saved-tensor hooks on tiny models of each family under
torch 2.13 with transformers 4.28.1 to 5.23.0, ten releases around each boundary (benchmarks/README.md,
"Eager attention across transformers versions"); tests/test_estimate_eager_scores.py re-checks the
installed version.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.core.versions import version_tuple
from autotune.estimate.estimate_types import EstimateSettings
from autotune.estimate.traits import ArchTraits

MASK_BYTES = 1  # CUDA's fused dropout keeps a bool mask
FP32 = 4

# OPT before 4.49 (modeling_opt.py of 4.28.1:211-255, clamp :225, softmax :230; the same in 4.48.0:201-210):
# scores + mask, then
# `torch.max(attn_weights, torch.tensor(finfo.min))` (transformers PR #18057), whose backward keeps its input,
# then `softmax(..., dtype=torch.float32).to(torch.float16)` only `if attn_weights.dtype == torch.float16`
# (PR #17437): bf16 and fp32 ran the softmax in their own dtype. From 4.49.0 (modeling_opt.py:168) every
# dtype runs `softmax(..., dtype=torch.float32).to(query_states.dtype)` and the clamp is gone (5.23:
# modeling_opt.py:88, eager_attention_forward).
OPT_FP32_SOFTMAX_FOR_ALL = (4, 49)
# GPT-NeoX up to 4.34.0 returned its rotary cos/sin as fp32 attributes (modeling_gpt_neox.py of 4.34.0:316,
# `self.cos_cached[:seq_len, ...].to(x.device)`), so a 16-bit model's rotated Q and K were promoted to fp32 and
# the softmax ran on fp32 scores; 4.35.0 (:317) casts cos/sin to x.dtype, so 4.35-4.48 softmax in 16 bits
# (4.48.0:127, `softmax(attn_scores, dim=-1)`); 4.49.0 (:121) upcasts explicitly again.
NEOX_ROTARY_CAST = (4, 35)
NEOX_FP32_SOFTMAX = (4, 49)
# T5 up to 5.14.0: `softmax(scores.float(), dim=-1).type_as(scores)` (modeling_t5.py of 4.28.1:560, 5.14.0:318);
# 5.15.0 moved to eager_attention_forward with `softmax(attn_weights, dim=-1)` in the model's dtype (:167).
T5_16BIT_SOFTMAX = (5, 15)


@dataclass(frozen=True)
class EagerSoftmax:
    """How one eager attention call treats its scores."""

    fp32: bool  # the softmax runs in fp32 and keeps its fp32 output (4 B), cast back to the model's dtype
    clamp_keeps_input: bool  # old OPT's torch.max clamp keeps its 16-bit input for backward


def _fp32_for(model_type: str, version: tuple[int, ...], precision: str, traits: ArchTraits) -> EagerSoftmax:
    if model_type == "opt" and version < OPT_FP32_SOFTMAX_FOR_ALL:
        return EagerSoftmax(fp32=precision == "fp16", clamp_keeps_input=True)
    if model_type == "gpt_neox" and NEOX_ROTARY_CAST <= version < NEOX_FP32_SOFTMAX:
        return EagerSoftmax(fp32=False, clamp_keeps_input=False)
    if model_type in ("t5", "mt5") and version < T5_16BIT_SOFTMAX:
        return EagerSoftmax(fp32=True, clamp_keeps_input=False)
    return EagerSoftmax(fp32=traits.fp32_softmax, clamp_keeps_input=False)


def eager_softmax(traits: ArchTraits, settings: EstimateSettings) -> EagerSoftmax:
    """The eager softmax of the transformers version the run used (settings.stack); the 5.23 traits when it is
    at least the newest boundary. An unknown version counts the larger of the two (as causal_loss_upcasts)."""
    version = version_tuple(settings.stack.transformers_version)
    if version is not None:
        return _fp32_for(traits.model_type, version, settings.precision, traits)
    d = 4 if settings.precision == "fp32" else 2
    candidates = (
        _fp32_for(traits.model_type, (0,), settings.precision, traits),
        _fp32_for(traits.model_type, (4, 40), settings.precision, traits),
        _fp32_for(traits.model_type, (99,), settings.precision, traits),
    )
    return max(candidates, key=lambda softmax: eager_scores_bytes(softmax, traits, d)[0])


def eager_scores_bytes(softmax: EagerSoftmax, traits: ArchTraits, d: int) -> tuple[int, int]:
    """(kept for backward, backward transient) bytes per score element of one eager attention call.

    Kept: the clamp's input (old OPT), the softmax output (fp32: 4 B, then its d-byte copy, which the value
    matmul keeps; without dropout the matmul keeps the softmax output itself), and under dropout its mask and
    output. Transient (above what is kept) while the call runs backward: two score-sized gradients in the
    softmax's dtype; and, when the clamp's backward runs (the softmax's tensors freed by then), torch's
    maximum backward `at::where(self == other, grad / 2, grad).masked_fill_(self < other, 0)`
    (tools/autograd/derivatives.yaml) holds its input, the incoming gradient, grad / 2 and where's result
    (d bytes each) and its comparison masks. Measured with MemTracker on the 4.28.1 and 5.23 op sequences
    (b=1, 4 heads, s=512, torch 2.13 CPU): 10 / 6 B above the kept bytes for the clamped fp32 / bf16 path,
    as counted here.
    """
    dropout = traits.attention_dropout > 0
    kept = d if softmax.clamp_keeps_input else 0
    if softmax.fp32 and d != FP32:
        kept += FP32 + d + (MASK_BYTES if dropout else 0)
        transient = 2 * FP32
    else:
        kept += d + ((MASK_BYTES + d) if dropout else 0)
        transient = 2 * d
    if softmax.clamp_keeps_input:
        transient = max(transient, 4 * d + 2 * MASK_BYTES - kept)
    return kept, transient
