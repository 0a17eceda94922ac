"""The activation model against what autograd really keeps: real forward/backward passes on CPU, measured
with torch's MemTracker (live tensor bytes by category, peak over the step).

Measured = peak of all live tensors minus parameters and parameter gradients at that moment; predicted =
the activation, logits and backward-window components. The points are chosen so the step's peak is the
activation peak (not the end-of-backward weight-gradient transient, which is a separate component).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tests.conftest import needs
from tests.fakes.activations import activation_peak

from autotune.estimate.activations import activation_breakdown
from autotune.estimate.constants import CPU_MATH_SDPA_BYTES_WITH_DROPOUT
from autotune.estimate.estimate_types import EstimateSettings
from autotune.estimate.runtime import RuntimeStack
from autotune.models import resolve_model, summarize
from autotune.models.architecture import build_model

# torch's MemTracker ships from torch 2.5 (torch/distributed/_tools/mem_tracker.py); on an older torch the module,
# and the modules that import its helpers, are skipped with this reason instead of failing the run at collection.
MemTracker = pytest.importorskip(
    "torch.distributed._tools.mem_tracker", reason="needs torch >= 2.5 (MemTracker measures the activations)"
).MemTracker
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# A 2-layer BLOOM (ALiBi, eager-only attention with an fp32 softmax) built from its config.
TINY_BLOOM = str(Path(__file__).parent / "data" / "models" / "tiny-bloom.json")
# MemTracker's module hooks warn when checkpointing re-enters a module during backward; harmless here.
pytestmark = pytest.mark.filterwarnings("ignore:Module is None:UserWarning")


def _hf_loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss  # like the trial runner: only .loss is kept


def _16bit_shifted_loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The causal-LM loss of transformers before 4.46 for BLOOM / GPT-NeoX / GPT-2 (and of loops that compute
    their own loss on `output.logits`): CrossEntropyLoss on the 16-bit shifted logits, no upcast."""
    logits = model(input_ids=ids).logits
    shifted = logits[..., :-1, :].contiguous()
    return F.cross_entropy(shifted.view(-1, shifted.size(-1)), ids[..., 1:].reshape(-1))


def measured_activation_peak(
    name: str, precision: str, micro_batch: int, seq_len: int, checkpointing: bool, loss=_hf_loss
) -> int:
    source = resolve_model(name)
    torch.manual_seed(0)
    model, _ = build_model(source.config, source.architecture, "cpu")
    model.to(DTYPES[precision]).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, 1000, (micro_batch, seq_len))
    return activation_peak(model, lambda: loss(model, ids))


# (model, precision, micro-batch, seq, checkpointing, tolerance): decoder-only models are within 10%;
# T5 under checkpointing is over-predicted by up to ~20% (its shared relative-position bias and zero cross
# bias are kept per checkpoint by transformers, which we count conservatively).
# Measured against transformers 5's T5 and BLOOM code; on 4.51.3 these two cases keep more than the 10% allows
# (benchmarks/results/version_floors.json), a difference the memory model does not key on the version yet.
ON_TRANSFORMERS_5 = needs("transformers", "5.0", "the activation figures follow transformers 5's T5/BLOOM code")
CASES = [
    ("gpt2-small-demo", "bf16", 2, 128, False, 0.10),
    ("gpt2-small-demo", "bf16", 2, 128, True, 0.10),
    ("gpt2-small-demo", "fp32", 1, 256, False, 0.10),
    ("tiny-llama", "fp32", 2, 128, False, 0.10),
    ("tiny-llama", "bf16", 2, 256, True, 0.10),
    pytest.param("tiny-t5", "bf16", 2, 128, False, 0.10, marks=ON_TRANSFORMERS_5),
    ("tiny-t5", "fp32", 1, 256, True, 0.25),
    # BLOOM runs eager attention even when sdpa is asked for (no fused path in transformers): fp32 softmax kept.
    (TINY_BLOOM, "bf16", 2, 256, False, 0.10),
    (TINY_BLOOM, "fp32", 1, 256, False, 0.10),
    pytest.param(TINY_BLOOM, "bf16", 2, 256, True, 0.10, marks=ON_TRANSFORMERS_5),
]


@pytest.mark.parametrize("name,precision,micro_batch,seq_len,checkpointing,tolerance", CASES)
def test_activation_model_matches_autograd(name, precision, micro_batch, seq_len, checkpointing, tolerance):
    summary = summarize(resolve_model(name))
    settings = EstimateSettings(seq_len=seq_len, precision=precision, attention="sdpa", device="cpu")
    predicted = activation_breakdown(summary, settings, checkpointing).total(micro_batch)
    measured = measured_activation_peak(name, precision, micro_batch, seq_len, checkpointing)
    assert predicted == pytest.approx(measured, rel=tolerance), f"predicted {predicted}, measured {measured}"


@pytest.mark.parametrize("micro_batch,seq_len", [(2, 256), (4, 128)])
def test_16bit_causal_loss_of_older_transformers(micro_batch, seq_len):
    """transformers < 4.46 ran BLOOM's loss on 16-bit logits: 3*d per token and vocabulary entry, not the 12 B of
    the fp32 path (which would over-predict this case by 25-35%)."""
    summary = summarize(resolve_model(TINY_BLOOM))
    old_stack = RuntimeStack(transformers_version="4.29.0")
    settings = EstimateSettings(seq_len=seq_len, precision="bf16", attention="sdpa", device="cpu", stack=old_stack)
    predicted = activation_breakdown(summary, settings, False).total(micro_batch)
    measured = measured_activation_peak(TINY_BLOOM, "bf16", micro_batch, seq_len, False, loss=_16bit_shifted_loss)
    assert predicted == pytest.approx(measured, rel=0.15), f"predicted {predicted}, measured {measured}"


def test_cpu_math_attention_constant():
    """torch's CPU sdpa falls back to an fp32 math kernel under dropout: ~14 bytes per score element."""
    heads, seq, dim = 4, 512, 64
    q, k, v = (torch.randn(1, heads, seq, dim, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    tracker = MemTracker()
    with tracker:
        output = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
        current = next(iter(tracker.get_tracker_snapshot("current").values()))
    kept = sum(v for key, v in current.items() if "Total" not in str(key)) - output.numel() * output.element_size()
    per_score = kept / (heads * seq * seq)
    assert per_score == pytest.approx(CPU_MATH_SDPA_BYTES_WITH_DROPOUT, rel=0.1)
