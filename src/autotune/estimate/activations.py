"""Activation memory: what autograd keeps between forward and backward, per micro-batch sample.

The per-layer accounting follows Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models"): about s*b*h*(34 + 5*a*s/h) bytes per layer in 16-bit with eager attention. We count
the same tensors but from what transformers 5.23 really runs, so the terms are explicit per tensor:
GQA shrinks K and V, the MLP width and gating enter, RMSNorm keeps an fp32 copy, fused attention
kernels (sdpa on CUDA, flash) keep no s^2 matrix while eager attention does, and torch's CPU sdpa
falls back to an fp32 math kernel (with s^2 terms) under dropout or an additive bias.
tests/test_estimate_activations.py checks the result against MemTracker on real forward/backward passes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autotune.core.versions import version_tuple
from autotune.estimate.constants import CPU_MATH_SDPA_BYTES_NO_DROPOUT, CPU_MATH_SDPA_BYTES_WITH_DROPOUT
from autotune.estimate.eager_scores import eager_scores_bytes, eager_softmax
from autotune.estimate.estimate_types import EstimateSettings
from autotune.estimate.kernels import LOSS_PER_TOKEN_BYTES, RSTD_BYTES, FusedKernels, LossChunk, fused_kernels
from autotune.estimate.traits import ArchTraits, traits_of
from autotune.models import ModelSummary

MASK_BYTES = 1  # dropout keeps a bool mask


@dataclass(frozen=True)
class ActivationBreakdown:
    """Bytes for one micro-batch; `per_sample` parts scale with the micro-batch, `shared` ones do not.

    The peak is the larger of two moments of the backward pass: the loss's own backward, with the logits
    gradients at full size, and the backward of one layer (with checkpointing: its recomputation).
    """

    saved_per_sample: int  # kept for backward: all layers, or only layer inputs under checkpointing
    saved_shared: int  # e.g. T5's relative-position bias, computed once per batch
    logits_per_sample: int  # logits, fp32 upcast, log-softmax and their gradients at the loss's peak
    layer_window_per_sample: int  # one layer's backward gradients (+ its recomputation under checkpointing)
    loss_chunk: LossChunk | None = None  # a fused linear cross-entropy's logits chunk (estimate/kernels.py)

    def saved(self, micro_batch: int) -> int:
        return self.saved_per_sample * micro_batch + self.saved_shared

    def logits(self, micro_batch: int) -> int:
        chunk = self.loss_chunk.bytes(micro_batch) if self.loss_chunk is not None else 0
        return self.logits_per_sample * micro_batch + chunk

    def layer_window_excess(self, micro_batch: int) -> int:
        """How far one layer's backward window rises above the loss peak: the two never coexist."""
        return max(0, self.layer_window_per_sample * micro_batch - self.logits(micro_batch))

    def total(self, micro_batch: int) -> int:
        return self.saved(micro_batch) + self.logits(micro_batch) + self.layer_window_excess(micro_batch)


# transformers gained its native SDPA path in 4.36 ("In Transformers 4.36, we started adding native support of
# torch.nn.functional.scaled_dot_product_attention", huggingface/transformers#28005); before it every model ran its
# eager attention (torch's SDPA itself is public from torch 2.0, pytorch/pytorch#92189). Families added later, or
# never, are traits._EAGER_ONLY_TYPES.
FIRST_SDPA_TRANSFORMERS = (4, 36)


def _as_run(model: ModelSummary, settings: EstimateSettings) -> EstimateSettings:
    """The attention transformers really runs: eager for families without a fused path (traits._EAGER_ONLY_TYPES)
    and for any family on a transformers older than its SDPA path; flash-attn is the user's own choice."""
    if settings.attention == "eager":
        return settings
    if traits_of(model).eager_only:
        return replace(settings, attention="eager")
    version = version_tuple(settings.stack.transformers_version)
    if settings.attention == "sdpa" and version is not None and version[:2] < FIRST_SDPA_TRANSFORMERS:
        return replace(settings, attention="eager")
    return settings


def activation_bytes_per_element(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def _norm_bytes(traits: ArchTraits, width: int, d: int) -> int:
    """What one norm keeps per token (its output is counted where the next layer saves it)."""
    if traits.rmsnorm:
        return (4 + d) * width  # fp32 copy of the input + the normalised value before the weight
    return d * width  # LayerNorm keeps its input (mean and rstd are per token, negligible)


def _dropout_mask(probability: float, width: int) -> int:
    return MASK_BYTES * width if probability > 0 else 0


def _scores_bytes_per_element(traits: ArchTraits, settings: EstimateSettings, d: int) -> tuple[int, int]:
    """(kept for backward, backward transient) bytes per s^2 element of one attention call."""
    if settings.attention == "eager":  # by family and transformers version: estimate/eager_scores.py
        return eager_scores_bytes(eager_softmax(traits, settings), traits, d)
    if settings.attention == "sdpa" and settings.device == "cpu":
        if traits.attention_dropout > 0:
            return CPU_MATH_SDPA_BYTES_WITH_DROPOUT, 2 * 4
        if traits.relative_bias:
            return CPU_MATH_SDPA_BYTES_NO_DROPOUT, 2 * 4
    if settings.attention == "sdpa" and traits.relative_bias:
        return d, d  # the memory-efficient kernel keeps the additive bias it was given, and returns its grad
    return 0, 0


def _fused_kernel(traits: ArchTraits, settings: EstimateSettings) -> bool:
    """Flash / memory-efficient attention: no s^2 matrix, but the kernel keeps its output for backward."""
    if settings.attention == "eager":
        return False
    if settings.attention == "sdpa" and settings.device == "cpu":
        return traits.attention_dropout == 0 and not traits.relative_bias  # else torch's math fallback
    return True


def _scores_elements(model: ModelSummary, settings: EstimateSettings) -> int:
    return model.num_heads * settings.seq_len * settings.seq_len


def _attention_block(model: ModelSummary, traits: ArchTraits, settings: EstimateSettings, cross: bool) -> int:
    """Self- or cross-attention sub-block per sample: norm, Q/K/V, kernel output, output projection."""
    d = activation_bytes_per_element(settings.precision)
    tokens = settings.seq_len
    h = model.hidden_size
    q_width = model.num_heads * model.head_dim
    kv_width = model.num_kv_heads * model.head_dim
    per_token = _norm_bytes(traits, h, d) + d * h  # norm internals + its output, the projections' input
    per_token += d * q_width  # Q (rotary replaces it by the rotated copy: same size)
    per_token += 0 if cross else 2 * d * kv_width  # cross-attention K/V come from the shared encoder output
    per_token += d * q_width  # the heads merged into a contiguous copy, o_proj's input
    per_token += d * q_width if _fused_kernel(traits, settings) else 0  # a fused kernel keeps its output
    per_token += _dropout_mask(traits.hidden_dropout, h)
    kept_per_score, _ = _scores_bytes_per_element(traits, settings, d)
    per_sample = per_token * tokens + kept_per_score * _scores_elements(model, settings)
    if cross:
        per_sample += 2 * d * kv_width * tokens  # K/V of the encoder output (its length = seq_len here)
    return per_sample


def _mlp_block(model: ModelSummary, traits: ArchTraits, settings: EstimateSettings) -> int:
    d = activation_bytes_per_element(settings.precision)
    h = model.hidden_size
    width = model.intermediate_size
    intermediate_tensors = traits.activation_saved + (2 if traits.gated_mlp else 0)  # + up output, product
    per_token = _norm_bytes(traits, h, d) + d * h + intermediate_tensors * d * width
    per_token += MASK_BYTES * width if traits.mlp_dropout else 0
    per_token += _dropout_mask(traits.hidden_dropout, h)
    return per_token * settings.seq_len


def layer_bytes(model: ModelSummary, settings: EstimateSettings, decoder_with_cross: bool = False) -> int:
    """One transformer layer's saved activations per sample."""
    settings = _as_run(model, settings)
    traits = traits_of(model)
    total = _attention_block(model, traits, settings, cross=False) + _mlp_block(model, traits, settings)
    total += fused_layer_delta(model, traits, settings)
    if decoder_with_cross:
        total += _attention_block(model, traits, settings, cross=True)
    return total


def layer_backward_transient(model: ModelSummary, settings: EstimateSettings, decoder_with_cross: bool) -> int:
    """Gradients alive while one layer runs backward: score gradients and a few hidden-sized ones."""
    settings = _as_run(model, settings)
    traits = traits_of(model)
    d = activation_bytes_per_element(settings.precision)
    _, transient_per_score = _scores_bytes_per_element(traits, settings, d)
    attention_calls = 2 if decoder_with_cross else 1
    hidden = (2 * model.hidden_size + model.intermediate_size) * d * settings.seq_len
    return attention_calls * transient_per_score * _scores_elements(model, settings) + hidden


def _outside_layers_bytes(model: ModelSummary, traits: ArchTraits, settings: EstimateSettings) -> int:
    """Embedding dropout and the final norm of each stack, per sample."""
    d = activation_bytes_per_element(settings.precision)
    h = model.hidden_size
    stacks = 2 if model.family == "encoder-decoder" else 1
    per_stack = _dropout_mask(traits.embedding_dropout, h) + _norm_bytes(traits, h, d) + d * h
    per_stack += _dropout_mask(traits.hidden_dropout, h) if model.family == "encoder-decoder" else 0
    return stacks * per_stack * settings.seq_len


# transformers 4.46 moved every causal LM's loss into loss/loss_utils.py `ForCausalLMLoss`, which starts with
# `logits = logits.float()` (the upcast named in transformers PR #34147 and issue #38452). Before it, only the
# Llama-style forwards upcast (`logits = logits.float()` in LlamaForCausalLM.forward, as in 4.37); BLOOM, GPT-NeoX,
# GPT-2 and OPT called CrossEntropyLoss on the 16-bit shifted logits (`shift_logits = lm_logits[..., :-1, :]
# .contiguous()`), and so do training loops that compute their own loss on `output.logits` (h2o LLM Studio).
LOSS_UTILS_VERSION = (4, 46)
_FP32_LOGITS_BEFORE_LOSS_UTILS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "mixtral", "phi3")


def causal_loss_upcasts(model: ModelSummary, settings: EstimateSettings) -> bool:
    """Whether a causal LM's loss runs on fp32 logits. An unknown transformers version counts the upcast (the
    larger figure, and what every version since 4.46 does)."""
    version = version_tuple(settings.stack.transformers_version)
    if version is None or version >= LOSS_UTILS_VERSION:
        return True
    return model.model_type in _FP32_LOGITS_BEFORE_LOSS_UTILS


def logits_bytes_per_sample(model: ModelSummary, settings: EstimateSettings) -> int:
    """Logits and loss at their peak, at the start of backward, per sample.

    The trial runner (like HF Trainer) keeps only `.loss` of the model output, so the logits tensor is
    gone before backward; what remains is the loss's own graph. Causal LMs on an fp32 loss path
    (causal_loss_upcasts) keep the fp32 log-softmax and two fp32 gradients at once: 12 bytes per token per
    vocabulary entry in bf16 and fp32 alike. A 16-bit loss path (older transformers, T5 and BERT-style heads)
    keeps the 16-bit log-softmax and two gradients: 3*d. Both measured with MemTracker
    (tests/test_estimate_activations.py).
    """
    d = activation_bytes_per_element(settings.precision)
    upcast = model.family == "decoder-only" and causal_loss_upcasts(model, settings)
    per_token = 12 if upcast else 3 * d
    return per_token * model.vocab_size * settings.seq_len


def _shared_bytes(model: ModelSummary, traits: ArchTraits, settings: EstimateSettings) -> int:
    """Per-batch tensors: T5 computes its relative-position bias once per stack, shape (1, heads, s, s)."""
    if not traits.relative_bias or settings.attention == "flash":
        return 0
    stacks = 2 if model.family == "encoder-decoder" else 1
    bias_bytes = (
        4
        if settings.device == "cpu" and settings.attention == "sdpa"
        else activation_bytes_per_element(settings.precision)
    )
    return stacks * bias_bytes * model.num_heads * settings.seq_len * settings.seq_len


def _cross_attention_excess(
    model: ModelSummary, traits: ArchTraits, decoder: EstimateSettings, encoder_len: int
) -> int:
    """Cross-attention per sample when the encoder is longer (or shorter) than the decoder: _attention_block counts
    its K/V and score matrix at the decoder's length; they are (encoder length) and (decoder x encoder)."""
    d = activation_bytes_per_element(decoder.precision)
    extra = encoder_len - decoder.seq_len
    kept_per_score, _ = _scores_bytes_per_element(traits, decoder, d)
    kv = 2 * d * model.num_kv_heads * model.head_dim * extra
    return kv + kept_per_score * model.num_heads * decoder.seq_len * extra


def _encoder_decoder_breakdown(
    model: ModelSummary, settings: EstimateSettings, grad_checkpointing: bool
) -> ActivationBreakdown:
    """Encoder stack at settings.seq_len, decoder stack at settings.decoder_seq_len: each term of
    activation_breakdown counted at the length of the stack it belongs to (the loss at the decoder's)."""
    traits = traits_of(model)
    d = activation_bytes_per_element(settings.precision)
    decoder = replace(settings, seq_len=settings.decoder_seq_len or settings.seq_len)
    encoder_layer = layer_bytes(model, settings)
    decoder_layer = layer_bytes(model, decoder, decoder_with_cross=True)
    decoder_layer += _cross_attention_excess(model, traits, decoder, settings.seq_len)
    all_layers = model.num_layers * encoder_layer + model.num_decoder_layers * decoder_layer
    # the two-stack terms below count both stacks at one length: half of each is one stack
    outside = (_outside_layers_bytes(model, traits, settings) + _outside_layers_bytes(model, traits, decoder)) // 2
    shared = (_shared_bytes(model, traits, settings) + _shared_bytes(model, traits, decoder)) // 2
    logits_peak = logits_bytes_per_sample(model, decoder)
    window = max(
        layer_backward_transient(model, settings, decoder_with_cross=False),
        layer_backward_transient(model, decoder, decoder_with_cross=True),
    )
    if not grad_checkpointing:
        return ActivationBreakdown(all_layers + outside, shared, logits_peak, window)
    tokens = model.num_layers * settings.seq_len + model.num_decoder_layers * decoder.seq_len
    kept_inputs = d * model.hidden_size * tokens
    return ActivationBreakdown(kept_inputs + outside, shared, logits_peak, window + max(encoder_layer, decoder_layer))


def activation_breakdown(
    model: ModelSummary, settings: EstimateSettings, grad_checkpointing: bool
) -> ActivationBreakdown:
    settings = _as_run(model, settings)
    if model.family == "encoder-decoder" and settings.decoder_seq_len not in (None, settings.seq_len):
        return _encoder_decoder_breakdown(model, settings, grad_checkpointing)
    traits = traits_of(model)
    d = activation_bytes_per_element(settings.precision)
    encoder_decoder = model.family == "encoder-decoder"
    encoder_layer = layer_bytes(model, settings)
    largest_layer = layer_bytes(model, settings, decoder_with_cross=encoder_decoder)
    all_layers = model.num_layers * encoder_layer + model.num_decoder_layers * largest_layer
    outside = _outside_layers_bytes(model, traits, settings) + fused_outside_delta(model, traits, settings)
    logits_peak = fused_logits_bytes_per_sample(model, traits, settings)
    if logits_peak is None:
        logits_peak = logits_bytes_per_sample(model, settings)
    chunk = fused_loss_chunk(model, traits, settings)
    window = layer_backward_transient(model, settings, decoder_with_cross=encoder_decoder)
    shared = _shared_bytes(model, traits, settings)
    if not grad_checkpointing:
        return ActivationBreakdown(all_layers + outside, shared, logits_peak, window, loss_chunk=chunk)
    # HF checkpointing keeps each layer's input hidden state and rebuilds one layer at a time in backward.
    kept_inputs = model.total_layers * d * model.hidden_size * settings.seq_len
    return ActivationBreakdown(kept_inputs + outside, shared, logits_peak, window + largest_layer, loss_chunk=chunk)


# Fused training kernels (EstimateSettings.kernels; what each keeps, with its source, in estimate/kernels.py). They
# replace modules of decoder-only models only, so the encoder-decoder path above never sees them.


def _kernels_in_use(model: ModelSummary, traits: ArchTraits, settings: EstimateSettings) -> FusedKernels | None:
    """The kernel set when it changes this model on this device; None for stock modules. Liger and flash-attn
    kernels are Triton/CUDA: the CPU backend runs the stock modules."""
    kernels = fused_kernels(settings.kernels)
    if settings.device != "cuda" or not kernels.applies_to(model, traits.rmsnorm, traits.gated_mlp):
        return None
    return kernels


def _fused_norm_delta(traits: ArchTraits, width: int, d: int) -> int:
    """Per token: a fused RMSNorm keeps its 16-bit input and an fp32 rstd instead of _norm_bytes' fp32 copy and
    normalised value (negative: bytes saved)."""
    return d * width + RSTD_BYTES - _norm_bytes(traits, width, d)


def fused_layer_delta(model: ModelSummary, traits: ArchTraits, settings: EstimateSettings) -> int:
    """How much one decoder layer keeps per sample beyond layer_bytes' stock count (negative: less)."""
    kernels = _kernels_in_use(model, traits, settings)
    if kernels is None:
        return 0
    d = activation_bytes_per_element(settings.precision)
    per_token = 0
    if kernels.rms_norm and traits.rmsnorm:
        per_token += 2 * _fused_norm_delta(traits, model.hidden_size, d)  # input_layernorm, post_attention_layernorm
    if kernels.gated_mlp_tensors is not None and traits.gated_mlp:
        stock = traits.activation_saved + 2  # as _mlp_block counts a gated MLP
        per_token += (kernels.gated_mlp_tensors - stock) * d * model.intermediate_size
    return per_token * settings.seq_len


def fused_outside_delta(model: ModelSummary, traits: ArchTraits, settings: EstimateSettings) -> int:
    """The final norm per sample: fused, it keeps less; under a fused linear cross-entropy its output is not kept
    either (the op saves only the gradients it computed in the forward)."""
    kernels = _kernels_in_use(model, traits, settings)
    if kernels is None:
        return 0
    d = activation_bytes_per_element(settings.precision)
    per_token = _fused_norm_delta(traits, model.hidden_size, d) if kernels.rms_norm and traits.rmsnorm else 0
    if kernels.loss == "linear_cross_entropy":
        per_token -= d * model.hidden_size
    return per_token * settings.seq_len


def fused_logits_bytes_per_sample(model: ModelSummary, traits: ArchTraits, settings: EstimateSettings) -> int | None:
    """The loss's peak per sample with a fused loss; None: the stock loss (logits_bytes_per_sample).

    Fused cross-entropy: the logits it was given (fp32 where the causal loss upcasts) and their gradient.
    Fused linear cross-entropy: the hidden states' gradient and an fp32 loss per token; its logits chunk is
    fused_loss_chunk, and lm_head's weight gradient is the first gradient the states already count."""
    kernels = _kernels_in_use(model, traits, settings)
    if kernels is None or kernels.loss == "stock":
        return None
    d = activation_bytes_per_element(settings.precision)
    if kernels.loss == "cross_entropy":
        logits_bytes = 4 if causal_loss_upcasts(model, settings) else d
        return 2 * logits_bytes * model.vocab_size * settings.seq_len
    return (d * model.hidden_size + LOSS_PER_TOKEN_BYTES) * settings.seq_len


def fused_loss_chunk(model: ModelSummary, traits: ArchTraits, settings: EstimateSettings) -> LossChunk | None:
    """A fused linear cross-entropy's logits chunk, in the hidden states' dtype."""
    kernels = _kernels_in_use(model, traits, settings)
    if kernels is None or kernels.loss != "linear_cross_entropy":
        return None
    d = activation_bytes_per_element(settings.precision)
    return LossChunk(settings.seq_len, model.vocab_size, model.hidden_size, d)
