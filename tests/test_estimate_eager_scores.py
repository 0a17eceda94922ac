"""Eager attention's per-score bytes by family and transformers version (estimate/eager_scores.py).

The installed transformers is checked for real on a tiny OPT with eager attention: autograd's saved s x s
tensors (saved-tensor hooks, exact bytes) and the step's activation peak (MemTracker). Older versions, which
cannot be imported here, are checked through the arithmetic their source implies (measured once under
transformers 4.28.1-5.15.0 in a throwaway virtualenv: benchmarks/README.md, "Eager attention across
transformers versions").
"""

from __future__ import annotations

from dataclasses import replace
from importlib import metadata
from pathlib import Path

import pytest
import torch
from tests.fakes.activations import activation_peak
from tests.fakes.models import summary

from autotune.estimate.activations import activation_breakdown, layer_backward_transient, layer_bytes
from autotune.estimate.eager_scores import eager_scores_bytes, eager_softmax
from autotune.estimate.estimate_types import EstimateSettings
from autotune.estimate.runtime import RuntimeStack
from autotune.estimate.traits import traits_of
from autotune.models import resolve_model, summarize
from autotune.models.architecture import build_model

# 2 layers, 4 heads, hidden 64, no dropout (CPU dropout keeps a d-byte noise tensor where CUDA keeps a bool mask).
TINY_OPT = str(Path(__file__).parent / "data" / "models" / "tiny-opt.json")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
INSTALLED = RuntimeStack(transformers_version=metadata.version("transformers"))
pytestmark = pytest.mark.filterwarnings("ignore:Module is None:UserWarning")


def _eager_opt(precision: str) -> torch.nn.Module:
    source = resolve_model(TINY_OPT)
    torch.manual_seed(0)
    model, _ = build_model(source.config, source.architecture, "cpu", attn_implementation="eager")
    return model.to(DTYPES[precision]).train()


def _settings(seq_len: int, precision: str, version: str | None = None) -> EstimateSettings:
    stack = INSTALLED if version == "installed" else RuntimeStack(transformers_version=version)
    return EstimateSettings(seq_len=seq_len, precision=precision, attention="eager", device="cpu", stack=stack)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_saved_score_tensors_of_the_installed_opt_match_the_model(precision):
    """Every tensor autograd saves with an (s, s) tail, counted once per storage: exactly what we count."""
    model, seq_len, batch = _eager_opt(precision), 128, 2
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() >= 2 and tensor.shape[-2:] == (seq_len, seq_len) and tensor.shape.numel() > seq_len**2:
            storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    ids = torch.randint(0, 1000, (batch, seq_len))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(input_ids=ids, labels=ids)
    config = resolve_model(TINY_OPT).config
    scores = config["num_hidden_layers"] * batch * config["num_attention_heads"] * seq_len**2
    settings = _settings(seq_len, precision, "installed")
    traits = traits_of(summarize(resolve_model(TINY_OPT)))
    kept, _ = eager_scores_bytes(eager_softmax(traits, settings), traits, 4 if precision == "fp32" else 2)
    assert sum(storages.values()) == kept * scores


@pytest.mark.parametrize("precision,micro_batch,seq_len", [("bf16", 2, 256), ("fp32", 1, 512)])
def test_activation_peak_of_the_installed_eager_opt(precision, micro_batch, seq_len):
    """MemTracker peak (all live tensors minus parameters and their gradients) of one forward/backward."""
    model = _eager_opt(precision)
    ids = torch.randint(0, 1000, (micro_batch, seq_len))
    measured = activation_peak(model, lambda: model(input_ids=ids, labels=ids).loss)
    summary_ = summarize(resolve_model(TINY_OPT))
    predicted = activation_breakdown(summary_, _settings(seq_len, precision, "installed"), False).total(micro_batch)
    assert predicted == pytest.approx(measured, rel=0.10), f"predicted {predicted}, measured {measured}"


# --- the version history, as arithmetic ---------------------------------------------------------------------

OPT = summary(
    name="hand-opt",
    architecture="OPTForCausalLM",
    model_type="opt",
    config={"model_type": "opt", "dropout": 0.1, "attention_dropout": 0.0, "activation_function": "relu"},
)


def _per_score(model, precision: str, version: str | None) -> tuple[int, int]:
    traits = traits_of(model)
    d = 4 if precision == "fp32" else 2
    return eager_scores_bytes(eager_softmax(traits, _settings(512, precision, version)), traits, d)


@pytest.mark.parametrize(
    "precision,version,kept,transient",
    [
        # 4.28-4.48: clamp input (d) + fp16-only fp32 softmax (4) + its fp16 copy (2) = 8 B kept per score
        ("fp16", "4.28.1", 8, 8),
        ("bf16", "4.28.1", 4, 6),  # clamp input + the bf16 softmax output; the clamp's backward peaks at 4d + 2
        ("fp32", "4.48.0", 8, 10),
        # 4.49 on: fp32 softmax for every 16-bit dtype, no clamp (5.23 modeling_opt.py:88)
        ("fp16", "4.49.0", 6, 8),
        ("bf16", "5.23.0", 6, 8),
        ("fp32", "5.23.0", 4, 8),
    ],
)
def test_opt_eager_scores_follow_the_transformers_version(precision, version, kept, transient):
    assert _per_score(OPT, precision, version) == (kept, transient)


def test_an_unknown_transformers_version_counts_the_larger_eager_layout():
    assert _per_score(OPT, "fp16", None) == _per_score(OPT, "fp16", "4.28.1")  # 8 B over 6
    assert _per_score(OPT, "bf16", None) == _per_score(OPT, "bf16", "5.23.0")  # 6 B over 4


def test_other_families_history():
    neox = replace(OPT, model_type="gpt_neox", architecture="GPTNeoXForCausalLM", config={"model_type": "gpt_neox"})
    assert _per_score(neox, "fp16", "4.30.2")[0] == 6  # fp32 rotary cos/sin promote the scores to fp32
    assert _per_score(neox, "fp16", "4.45.0")[0] == 2  # cos/sin cast to the model's dtype from 4.35
    assert _per_score(neox, "fp16", "4.49.0")[0] == 6  # explicit fp32 softmax from 4.49
    t5 = replace(OPT, model_type="t5", architecture="T5ForConditionalGeneration", config={"model_type": "t5"})
    # T5's default 0.1 dropout: softmax output, bool mask, dropped-out probabilities
    assert _per_score(t5, "bf16", "5.14.0")[0] == 4 + 1 + 2  # softmax(scores.float()) kept in fp32
    assert _per_score(t5, "bf16", "5.15.0")[0] == 2 + 1 + 2
    for model_type in ("gpt2", "bert", "bloom"):  # unchanged from 4.28.1 to 5.23 (measured)
        other = replace(OPT, model_type=model_type, config={"model_type": model_type})
        assert _per_score(other, "fp16", "4.28.1") == _per_score(other, "fp16", "5.23.0")


def test_old_opt_layer_keeps_six_more_bytes_per_fp16_score_than_today():
    """The published OPT-1.3b point's difference, per layer: (8 - 6) B per score vs 5.23, (8 - 2) vs our old count."""

    def quadratic(version: str) -> int:
        def layer(seq_len):
            return layer_bytes(OPT, _settings(seq_len, "fp16", version))

        return (layer(1024) - 2 * layer(512)) // (1024**2 - 2 * 512**2)

    assert quadratic("4.28.1") == OPT.num_heads * 8
    assert quadratic("5.23.0") == OPT.num_heads * 6
    old_window = layer_backward_transient(OPT, _settings(512, "fp16", "4.28.1"), False)
    new_window = layer_backward_transient(OPT, _settings(512, "fp16", "5.23.0"), False)
    assert old_window == new_window  # both peak at the fp32 softmax's two gradients


def test_transformers_before_4_36_runs_eager_attention_whatever_is_asked() -> None:
    """No model had an SDPA path before transformers 4.36 (huggingface/transformers#28005): a Llama on 4.35 keeps its
    s^2 scores, on 4.36 it does not; an unknown version keeps what was asked."""
    from dataclasses import replace

    from autotune.estimate import EstimateSettings
    from autotune.estimate.activations import layer_bytes
    from autotune.estimate.runtime import RuntimeStack
    from autotune.models import resolve_model, summarize

    model = summarize(resolve_model("llama-3.2-1b"))
    asked = EstimateSettings(seq_len=2048, precision="bf16", attention="sdpa")

    def layer(version: str | None, attention: str = "sdpa") -> int:
        stack = RuntimeStack(transformers_version=version)
        return layer_bytes(model, replace(asked, attention=attention, stack=stack))

    assert layer("4.35.2") == layer("4.35.2", "eager") > layer("4.36.0") == layer(None)
