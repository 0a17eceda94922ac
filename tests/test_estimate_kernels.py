"""Fused training kernels (EstimateSettings.kernels): each kernel's saved bytes on a hand-built model, and --kernels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.fakes.models import summary, target

from autotune.cli import main
from autotune.core.ladder import Candidate, Rung
from autotune.core.versions import deepspeed_note
from autotune.estimate import EstimateSettings, estimate
from autotune.estimate.activations import activation_breakdown
from autotune.estimate.kernels import fused_kernels, linear_cross_entropy_chunk_rows
from autotune.estimate.runtime import RuntimeStack
from autotune.request.tune_request import KERNELS

ROOT = Path(__file__).resolve().parents[1]
TINYLLAMA = str(ROOT / "benchmarks" / "published" / "models" / "tinyllama-1.1b.json")

H, WIDTH, V, S, LAYERS = 2048, 5632, 32000, 2048, 22  # TinyLlama-1.1B's shapes
D = 2  # bf16

LLAMA = summary(
    name="hand-llama",
    architecture="LlamaForCausalLM",
    model_type="llama",
    hidden_size=H,
    num_layers=LAYERS,
    num_heads=32,
    num_kv_heads=4,
    head_dim=64,
    intermediate_size=WIDTH,
    vocab_size=V,
    config={"model_type": "llama", "hidden_act": "silu", "rms_norm_eps": 1e-5},
)


def settings(kernels: str = "stock", **overrides) -> EstimateSettings:
    return EstimateSettings(seq_len=S, precision="bf16", attention="flash", kernels=kernels, **overrides)


def breakdown(kernels: str, model=LLAMA, **overrides):
    return activation_breakdown(model, settings(kernels, **overrides), grad_checkpointing=False)


# What one norm keeps per token: stock (fp32 copy + normalised 16-bit value), fused (16-bit input + fp32 rstd).
STOCK_NORM, FUSED_NORM = (4 + D) * H, D * H + 4


def test_flash_attn_fused_layers_keep_fused_norms_and_two_swiglu_tensors():
    """Per layer: two norms, and the MLP keeps x1, x2 (xformers) instead of gate, SiLU, up and product."""
    saved = breakdown("stock").saved_per_sample - breakdown("flash-attn-fused").saved_per_sample
    per_layer = 2 * (STOCK_NORM - FUSED_NORM) + (4 - 2) * D * WIDTH
    final_norm = STOCK_NORM - FUSED_NORM
    assert saved == (LAYERS * per_layer + final_norm) * S


def test_liger_layers_keep_three_swiglu_tensors_and_no_final_norm_output():
    """Liger's SiLU-mul keeps a and b, down_proj keeps the product; under its fused linear cross-entropy the
    final norm's output is not kept either."""
    saved = breakdown("stock").saved_per_sample - breakdown("liger").saved_per_sample
    per_layer = 2 * (STOCK_NORM - FUSED_NORM) + (4 - 3) * D * WIDTH
    final_norm = STOCK_NORM - FUSED_NORM + D * H
    assert saved == (LAYERS * per_layer + final_norm) * S


def test_fused_cross_entropy_keeps_the_logits_and_their_gradient():
    """Stock: fp32 log-softmax + two fp32 gradients (12 bytes); flash-attn's CE: the fp32 logits + dlogits (8)."""
    assert breakdown("stock").logits_per_sample == 12 * V * S
    assert breakdown("flash-attn-fused").logits_per_sample == 8 * V * S
    old = RuntimeStack(transformers_version="4.37.2")  # Llama upcast its logits before loss_utils too
    assert breakdown("flash-attn-fused", stack=old).logits_per_sample == 8 * V * S


@pytest.mark.parametrize(
    ("tokens", "vocab", "hidden", "rows"),
    [
        (4096 * 4, 32000, 4096, 2048),  # the example in Liger's own comment (fused_linear_cross_entropy.py:98)
        (3 * 2048, 32000, 2048, 512),  # TinyLlama at micro-batch 3: cdiv(6144, 16) = 384 -> 512
        (100, 32000, 4096, 16),  # cdiv(100, 8) = 13 -> 16
        (6000, 1000, 2048, 6000),  # vocab below hidden: one chunk of all tokens, never more than BT
    ],
)
def test_linear_cross_entropy_chunk_rule(tokens, vocab, hidden, rows):
    assert linear_cross_entropy_chunk_rows(tokens, vocab, hidden) == rows


def test_liger_loss_is_a_chunk_plus_the_hidden_gradient_not_the_logits():
    liger = breakdown("liger")
    assert liger.logits_per_sample == (D * H + 4) * S  # grad_input (hidden states' dtype) + fp32 loss per token
    assert liger.logits(3) == 3 * (D * H + 4) * S + 512 * V * D
    assert liger.logits(1) == (D * H + 4) * S + 128 * V * D  # cdiv(2048, 16) = 128
    # the loss is no longer the larger moment: one layer's backward window rises above it
    assert liger.layer_window_excess(3) == liger.layer_window_per_sample * 3 - liger.logits(3) > 0


def test_estimate_components_follow_the_kernels():
    candidate = Candidate(Rung("z2"), 3, False)
    stock = estimate(LLAMA, target(gpus=2, memory=24 * 2**30), candidate, settings("stock"))
    liger = estimate(LLAMA, target(gpus=2, memory=24 * 2**30), candidate, settings("liger"))
    assert liger.gpu_components["logits"] == 3 * (D * H + 4) * S + 512 * V * D
    assert liger.gpu_components["activations"] < stock.gpu_components["activations"]
    assert liger.gpu_peak_bytes < stock.gpu_peak_bytes
    assert liger.gpu_components["model_states"] == stock.gpu_components["model_states"]


def test_kernels_change_nothing_where_they_do_not_apply():
    gpt2 = summary()  # LayerNorm, GELU MLP, not a Liger model type
    for name in KERNELS:
        assert breakdown(name, model=gpt2) == breakdown("stock", model=gpt2)
    # the CPU backend cannot run Triton kernels: stock modules there
    assert breakdown("liger", device="cpu") == breakdown("stock", device="cpu")
    mistral_like = summary(
        **{**LLAMA.__dict__, "model_type": "starcoder2", "config": {"hidden_act": "silu", "rms_norm_eps": 1e-5}}
    )
    assert breakdown("liger", model=mistral_like) == breakdown("stock", model=mistral_like)  # Liger patches types


def test_unknown_kernel_set_is_an_error():
    assert [fused_kernels(name).name for name in KERNELS] == list(KERNELS)  # every choice is modelled
    with pytest.raises(ValueError, match="kernels must be one of"):
        fused_kernels("triton")


def _plan(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--model", TINYLLAMA, "--gpu-type", "rtx-4090", "--gpus", "2", "-s", "2048", *args])
    captured = capsys.readouterr()
    return int(exited.value.code or 0), captured.out, captured.err


def test_plan_kernels_option_is_said_and_lowers_the_peak(capsys):
    _, stock_out, _ = _plan(capsys, "--micro-batch", "3", "--attention", "flash", "--json")
    code, liger_out, _ = _plan(capsys, "--micro-batch", "3", "--attention", "flash", "--json", "--kernels", "liger")
    assert code == 0
    stock, liger = json.loads(stock_out), json.loads(liger_out)
    assert liger["settings"]["kernels"] == "liger" and stock["settings"]["kernels"] == "stock"
    assert any("Liger" in note for note in liger["notes"])
    assert not [note for note in stock["notes"] if note != deepspeed_note()]  # a differing DeepSpeed says so
    z2 = next(row for row in liger["rows"] if row["rung"] == "z2" and not row["grad_checkpointing"])
    z2_stock = next(row for row in stock["rows"] if row["rung"] == "z2" and not row["grad_checkpointing"])
    assert z2["estimate"]["gpu_peak_bytes"] < z2_stock["estimate"]["gpu_peak_bytes"]
    _, table, _ = _plan(capsys, "--micro-batch", "3", "--kernels", "flash-attn-fused")
    assert "flash-attn-fused kernels" in table and "xformers' fused SwiGLU" in table


def test_plan_bad_kernels_is_one_line_exit_2(capsys):
    code, out, err = _plan(capsys, "--kernels", "apex")
    assert code == 2
    assert err.strip().count("\n") == 0 and "--kernels must be one of stock, liger, flash-attn-fused" in err
    assert "Traceback" not in err + out


def test_check_kernels_option(capsys, tmp_path):
    config = tmp_path / "ds.json"
    config.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": 3,
                "gradient_accumulation_steps": 4,
                "bf16": {"enabled": True},
                "zero_optimization": {"stage": 2},
            }
        )
    )
    base = ["check", str(config), "--model", TINYLLAMA, "--gpu-type", "rtx-4090", "--gpus", "2", "-s", "2048"]
    with pytest.raises(SystemExit):
        main([*base, "--json"])
    stock = json.loads(capsys.readouterr().out)
    with pytest.raises(SystemExit):
        main([*base, "--kernels", "liger", "--json"])
    liger = json.loads(capsys.readouterr().out)
    assert liger["fit"]["gpu_peak_bytes"] < stock["fit"]["gpu_peak_bytes"]
    assert any("Liger" in finding["message"] for finding in liger["findings"])
    assert not any("Liger" in finding["message"] for finding in stock["findings"])
    with pytest.raises(SystemExit) as exited:
        main([*base, "--kernels", "fused"])
    captured = capsys.readouterr()
    assert exited.value.code == 2 and "--kernels must be one of" in captured.err


def test_tune_notes_say_the_synthetic_trials_run_stock_modules():
    from autotune.request.context import kernel_notes
    from autotune.request.tune_request import TuneRequest

    liger = TuneRequest.of(model="m", kernels="liger")
    assert kernel_notes(TuneRequest.of(model="m"), trials_run=True) == []
    plan_only = kernel_notes(liger, trials_run=False)
    assert len(plan_only) == 1 and "Liger" in plan_only[0]
    with_trials = kernel_notes(liger, trials_run=True)
    assert len(with_trials) == 2 and "stock modules" in with_trials[1]
    own_command = TuneRequest.of(model="m", kernels="liger", command=("python", "train.py"))
    assert len(kernel_notes(own_command, trials_run=True)) == 1  # the user's own job runs their kernels


def test_hf_trainer_launch_turns_liger_on_when_the_prediction_counted_it(tmp_path):
    from autotune.dsconfig.launchers import TunedRun, hf_trainer_flags

    run = TunedRun(
        tmp_path / "c.json",
        tmp_path / "c.hf.json",
        tmp_path / "c.yaml",
        3,
        accumulation=4,
        precision="bf16",
        grad_checkpointing=False,
        stage=2,
    )
    assert "--use_liger_kernel" not in hf_trainer_flags(run)
    assert hf_trainer_flags(TunedRun(**{**run.__dict__, "kernels": "liger"})).endswith("--use_liger_kernel")
    # flash-attn-fused kernels are switched on by the user's own code (e.g. TINY_FUSED_* in whyNLP/tinyllama)
    assert "--use_liger_kernel" not in hf_trainer_flags(TunedRun(**{**run.__dict__, "kernels": "flash-attn-fused"}))
