"""`autotune plan` answering what users ask: their own ds_config, a fixed micro-batch, an optimizer and LoRA,
encoder/decoder lengths, and host RAM held to a limit. Memory-model only: nothing is launched."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from tests.conftest import needs

from autotune.check import check_config, resolve_context
from autotune.cli import main
from autotune.core.ladder import Candidate, Mode, Rung
from autotune.estimate import check_fit, estimate
from autotune.estimate.activations import _encoder_decoder_breakdown, activation_breakdown
from autotune.estimate.estimate_types import EstimateSettings
from autotune.estimate.runtime import RuntimeStack, local_stack
from autotune.hardware.specs import Target, resolve_gpu_type
from autotune.models import resolve_model, summarize
from autotune.request.context import TuneContext, known_accumulation
from autotune.request.tune_request import TuneRequest
from autotune.tuning.recommend import recommend

GIB = 1 << 30


def plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(["plan", *args])
    captured = capsys.readouterr()
    return int(exited.value.code or 0), captured.out, captured.err


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code, out, err = plan(capsys, *args, "--json")
    assert out, err
    return code, json.loads(out)


def write(tmp_path: Path, name: str, data: dict | str) -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def stage2(offload: bool, micro_batch: int | str = 2) -> dict:
    zero: dict = {"stage": 2, "overlap_comm": True}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
    }


GPT2_ON_24G = ("--model", "gpt2", "--gpu-memory", "24GiB", "--host-memory", "256GiB")


def test_config_with_optimizer_offload_moves_memory_from_gpu_to_host(capsys, tmp_path):
    _, plain = plan_json(capsys, *GPT2_ON_24G, "--config", write(tmp_path, "a.json", stage2(False)))
    _, offloaded = plan_json(capsys, *GPT2_ON_24G, "--config", write(tmp_path, "b.json", stage2(True)))
    assert plain["fits"] and offloaded["fits"]
    assert offloaded["candidate"]["rung"] == "z2+offload_opt" and plain["candidate"]["rung"] == "z2"
    assert offloaded["estimate"]["gpu_peak_bytes"] < plain["estimate"]["gpu_peak_bytes"]
    assert offloaded["estimate"]["host_ram_bytes"] > plain["estimate"]["host_ram_bytes"]
    assert offloaded["pinned_host_bytes"] > 0 and plain["pinned_host_bytes"] == 0


def test_config_knobs_as_written_change_the_answer(capsys, tmp_path):
    """Buckets as written: a 2e9-element reduce bucket costs more GPU memory than 5e7."""
    small, large = stage2(False), stage2(False)
    small["zero_optimization"]["reduce_bucket_size"] = 5e7
    large["zero_optimization"]["reduce_bucket_size"] = 2e9
    _, a = plan_json(capsys, *GPT2_ON_24G, "--config", write(tmp_path, "s.json", small))
    _, b = plan_json(capsys, *GPT2_ON_24G, "--config", write(tmp_path, "l.json", large))
    assert b["estimate"]["gpu_peak_bytes"] > a["estimate"]["gpu_peak_bytes"]


def test_config_that_does_not_fit_exits_3_with_the_reason(capsys, tmp_path):
    config = write(tmp_path, "big.json", stage2(False, micro_batch=64))
    code, out, err = plan(capsys, "--model", "gpt2-xl", "--gpu-memory", "8GiB", "--config", config)
    assert code == 3
    assert "does not fit" in out and "limit" in out and "margin" in out and "host RAM" in out
    assert "does not fit" in err


def test_hf_auto_config_needs_a_micro_batch_and_takes_it(capsys, tmp_path):
    auto = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"},
    }
    path = write(tmp_path, "auto.json", auto)
    code, _, err = plan(capsys, *GPT2_ON_24G, "--config", path)
    assert code == 2 and "--micro-batch" in err and len(err.strip().splitlines()) == 1
    code, data = plan_json(capsys, *GPT2_ON_24G, "--config", path, "--micro-batch", "4")
    assert code == 0 and data["candidate"]["micro_batch"] == 4 and data["candidate"]["rung"] == "z3"
    assert data["settings"]["precision"] == "bf16"  # "auto": what --precision (default bf16 here) fills
    assert data["settings"]["knobs"]["gradient_accumulation_steps"] is None
    _, data = plan_json(capsys, *GPT2_ON_24G, "--config", path, "--micro-batch", "4", "--global-batch", "32")
    assert data["settings"]["knobs"]["gradient_accumulation_steps"] == 8


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "not found"),
        ("{not json", "not valid JSON"),
        ({"zero_optimization": {"stage": 7}, "train_micro_batch_size_per_gpu": 1}, "stage"),
        ({"zero_optimization": {"stage": 2, "nonsense": 1}, "train_micro_batch_size_per_gpu": 1}, "nonsense"),
        ({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "many"}, "train_micro_batch"),
    ],
)
def test_bad_config_is_one_line_exit_2(capsys, tmp_path, content, expected):
    path = str(tmp_path / "missing.json") if content is None else write(tmp_path, "bad.json", content)
    code, out, err = plan(capsys, *GPT2_ON_24G, "--config", path)
    assert code == 2
    assert expected in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert out == ""


def test_plan_config_and_check_give_the_same_verdict(capsys, tmp_path):
    """One fit rule: `check --model` and `plan --config` call check.fit.predict_config on the same inputs."""
    for offload, micro in ((False, 2), (True, 2), (False, 48)):
        path = write(tmp_path, f"c{offload}{micro}.json", stage2(offload, micro))
        _, planned = plan_json(capsys, "--model", "gpt2", "--gpu-memory", "12GiB", "--config", path)
        model = summarize(resolve_model("gpt2", False))
        report = check_config(
            Path(path), resolve_context(None, 1, None, "12GiB"), None, model, seq_len=1024, grad_checkpointing=False
        )
        assert report.fit is not None
        assert report.fit.fits == planned["fits"]
        assert report.fit.gpu_peak_bytes == planned["estimate"]["gpu_peak_bytes"]


def test_fixed_micro_batch_evaluates_every_row_at_it(capsys):
    code, data = plan_json(capsys, "--model", "gpt2", "--gpu-type", "a100-80gb", "--micro-batch", "4")
    assert code == 0
    assert {row["estimate"]["candidate"]["micro_batch"] for row in data["rows"]} == {4}
    assert {row["micro_batch"] for row in data["rows"]} <= {4, None}
    assert data["recommended"]["micro_batch"] == 4


def test_fixed_micro_batch_must_divide_the_global_batch(capsys):
    code, _, err = plan(capsys, "--model", "gpt2", "--gpu-type", "a100-80gb", "--gpus", "2", "--micro-batch", "3",
                        "--global-batch", "16")  # fmt: skip
    assert code == 2 and "global batch" in err


def test_lora_lowers_optimizer_states(capsys):
    _, full = plan_json(capsys, "--model", "gpt2", "--gpu-type", "a100-80gb", "--micro-batch", "1")
    _, lora = plan_json(capsys, "--model", "gpt2", "--gpu-type", "a100-80gb", "--micro-batch", "1", "--lora-rank", "8")
    full_states = full["rows"][0]["estimate"]["gpu_components"]["model_states"]
    lora_states = lora["rows"][0]["estimate"]["gpu_components"]["model_states"]
    assert lora_states < full_states / 2


def test_optimizer_reaches_the_estimate(capsys):
    """torch.optim.AdamW (torch_adam) builds step temporaries that DeepSpeed's FusedAdam does not
    (optimizers.optimizer_memory); Adafactor keeps other states: each --optimizer gives its own peak."""
    peaks = {}
    for name in ("adamw", "torch-adamw", "adafactor"):
        args = ("--model", "gpt2", "--gpu-type", "a100-80gb", "--micro-batch", "1", "--optimizer", name)
        _, data = plan_json(capsys, *args)
        assert data["settings"]["optimizer"] == name
        peaks[name] = data["rows"][0]["estimate"]["gpu_peak_bytes"]
    assert peaks["torch-adamw"] > peaks["adamw"]
    assert peaks["adafactor"] != peaks["adamw"]


def test_encoder_decoder_lengths_change_activations(capsys):
    base = ("--model", "t5-small", "--gpu-memory", "16", "--micro-batch", "2", "--seq-len", "512")
    _, short = plan_json(capsys, *base, "--decoder-seq-len", "64")
    _, same = plan_json(capsys, *base)
    _, long = plan_json(capsys, *base, "--decoder-seq-len", "1024")
    acts = [d["rows"][0]["estimate"]["gpu_components"]["activations"] for d in (short, same, long)]
    assert acts[0] < acts[1] < acts[2]
    assert short["settings"]["decoder_seq_len"] == 64


def test_decoder_length_is_refused_for_decoder_only_models(capsys):
    code, _, err = plan(capsys, "--model", "gpt2", "--gpu-memory", "16", "--decoder-seq-len", "64")
    assert code == 2 and "encoder-decoder" in err


def test_split_lengths_reduce_to_the_single_length_formula():
    model = summarize(resolve_model("t5-small", False))
    for checkpointing in (False, True):
        settings = EstimateSettings(seq_len=256, decoder_seq_len=256)
        assert _encoder_decoder_breakdown(model, settings, checkpointing) == activation_breakdown(
            model, replace(settings, decoder_seq_len=None), checkpointing
        )


MISTRAL_4090 = ("--model", "mistral-7b", "--gpus", "1", "--gpu-type", "rtx-4090")


def test_host_memory_excludes_an_offload_pick_it_cannot_hold(capsys):
    code, data = plan_json(capsys, *MISTRAL_4090, "--host-memory", "64")
    for row in data["rows"]:
        if row["micro_batch"]:
            assert row["estimate"]["host_ram_bytes"] <= 64 * GIB
    assert code == 3 or data["recommended_estimate"]["host_ram_bytes"] <= 64 * GIB
    offloads = [r for r in data["rows"] if r["rung"] in ("z2+offload_opt", "z3+offload_opt")]
    assert all(r["verdict"]["limit"] == "host" for r in offloads if not r["micro_batch"] and r["grad_checkpointing"])
    code, data = plan_json(capsys, *MISTRAL_4090, "--host-memory", "256")
    assert code == 0 and "offload" in data["recommended"]["rung"] and data["host_ram_known"]


def test_unknown_host_memory_is_printed_beside_the_pick(capsys):
    code, out, _ = plan(capsys, *MISTRAL_4090)
    assert code == 0
    pick = out[out.index("Fastest predicted to fit") :]
    assert "needs host RAM" in pick and "pass --host-memory" in pick and "pinned" in pick
    assert "row peak" not in out  # the pick's own peak, not another micro-batch's


def test_host_memory_is_for_planning_elsewhere():
    from autotune.errors import UserError
    from autotune.request.validation import validate

    with pytest.raises(UserError, match="--host-memory"):
        validate(TuneRequest.of(model="gpt2", device="cpu", host_memory="64"), outputs=False)


def test_unknown_host_prefers_a_config_without_host_offload():
    """mistral-7b on 2 x A100-80GB: with the host RAM known, ZeRO-2 + optimizer offload at a large micro-batch is
    the fastest fit; with it unknown, the pick is a fit that needs no host offload, and its estimate is its own."""
    model = summarize(resolve_model("mistral-7b", False))
    target = Target(resolve_gpu_type("a100-80gb"), 2, 1, 80 * GIB)
    request = TuneRequest.of(model="mistral-7b", gpu_type="a100-80gb", gpus=2)
    unknown = recommend(TuneContext.build(request, model=model, target=target, outputs=False))
    known = recommend(
        TuneContext.build(request, model=model, target=replace(target, host_ram_bytes=1024 * GIB), outputs=False)
    )
    assert known.candidate is not None and known.candidate.rung.offload_optimizer == "cpu"
    assert unknown.candidate is not None and not unknown.candidate.rung.offload_optimizer
    assert unknown.host_unknown and not known.host_unknown
    assert unknown.estimate is not None and unknown.estimate.candidate == unknown.candidate
    assert unknown.passed_over is not None and unknown.passed_over.rung.offload_optimizer == "cpu"
    assert known.passed_over is None


def test_probed_target_passes_the_local_stack_and_profiles_do_not():
    model = summarize(resolve_model("gpt2", False))
    spec = resolve_gpu_type("a100-80gb")
    request = TuneRequest.of(model="gpt2")
    probed = TuneContext.build(request, model=model, target=Target(spec, 1, 1, 80 * GIB, measured=True), outputs=False)
    planned = TuneContext.build(request, model=model, target=Target(spec, 1, 1, 80 * GIB), outputs=False)
    assert probed.settings.stack == local_stack(spec.compute_capability)
    assert planned.settings.stack == RuntimeStack()


def test_known_gradient_accumulation_reaches_the_knobs():
    assert known_accumulation(None, None, 4) == 1  # autotune chooses the batch: accumulation 1 (dsconfig)
    assert known_accumulation(64, 2, 4) == 8
    assert known_accumulation(64, None, 4) is None  # the search varies it
    model = summarize(resolve_model("gpt2", False))
    target = Target(resolve_gpu_type("a100-80gb"), 2, 1, 80 * GIB)
    free = TuneContext.build(TuneRequest.of(model="gpt2", gpus=2), model=model, target=target, outputs=False)
    pinned = TuneContext.build(
        TuneRequest.of(model="gpt2", gpus=2, global_batch=64), model=model, target=target, outputs=False
    )
    assert free.settings.knobs.gradient_accumulation_steps == 1
    assert pinned.settings.knobs.gradient_accumulation_steps is None
    candidate = Candidate(Rung.Z1, 1, False)
    # ZeRO-1 keeps the full 16-bit gradient only with accumulation (stage_1_and_2.py:2290-2295)
    assert (
        estimate(model, target, candidate, free.settings).gpu_peak_bytes
        < estimate(model, target, candidate, pinned.settings).gpu_peak_bytes
    )


def test_plan_only_tune_notes_the_host_need(tmp_path):
    from autotune.tuner import tune

    request = TuneRequest.of(
        model="mistral-7b", gpus=1, gpu_type="rtx-4090", out=str(tmp_path / "ds.json"), use_cache=False
    )
    result = tune(request)
    assert not result.verified
    assert any("needs host RAM" in note for note in result.report.notes)


def test_plan_only_tune_holds_host_memory(tmp_path):
    from autotune.errors import NothingFitsError
    from autotune.tuner import tune

    request = TuneRequest.of(
        model="mistral-7b", gpus=1, gpu_type="rtx-4090", host_memory="64", out=str(tmp_path / "ds.json"),
        use_cache=False,
    )  # fmt: skip
    with pytest.raises(NothingFitsError):
        tune(request)
    assert not (tmp_path / "ds.json").exists()


@pytest.mark.filterwarnings("ignore:Module is None:UserWarning")
@pytest.mark.parametrize(("encoder_len", "decoder_len"), [(256, 64), (64, 256)])
@needs("transformers", "5.0", "the activation figures follow transformers 5's T5 code")
def test_split_lengths_match_autograd_on_tiny_t5(encoder_len, decoder_len):
    """Encoder and decoder at different lengths, measured with MemTracker as tests/test_estimate_activations.py
    does for equal ones (same 10% tolerance for T5 in bf16 without checkpointing)."""
    import torch
    from tests.fakes.activations import activation_peak

    from autotune.models.architecture import build_model

    source = resolve_model("tiny-t5")
    torch.manual_seed(0)
    model, _ = build_model(source.config, source.architecture, "cpu")
    model.to(torch.bfloat16).train()
    inputs, labels = torch.randint(0, 1000, (2, encoder_len)), torch.randint(0, 1000, (2, decoder_len))
    measured = activation_peak(model, lambda: model(input_ids=inputs, labels=labels).loss)
    settings = EstimateSettings(
        seq_len=encoder_len, decoder_seq_len=decoder_len, precision="bf16", attention="sdpa", device="cpu"
    )
    predicted = activation_breakdown(summarize(source), settings, False).total(2)
    assert predicted == pytest.approx(measured, rel=0.10), f"predicted {predicted}, measured {measured}"


def stage3_offload(ratio: float | None, sub_group_size: int | None, device: str | None = "cpu") -> dict:
    zero: dict = {"stage": 3}
    if device:
        zero["offload_optimizer"] = {"device": device, "pin_memory": True}
        if ratio is not None:
            zero["offload_optimizer"]["ratio"] = ratio
    if sub_group_size is not None:
        zero["sub_group_size"] = sub_group_size
    return {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": zero}


LLAMA_1B_ON_24G = ("--model", "llama-3.2-1b", "--gpu-memory", "24GiB", "--seq-len", "1024")


def _plan_and_check_peak(capsys, tmp_path: Path, name: str, config: dict) -> tuple[dict, int]:
    """plan --config's answer and check --model's predicted peak for the same config: one fit rule."""
    path = write(tmp_path, name, config)
    _, planned = plan_json(capsys, *LLAMA_1B_ON_24G, "--config", path)
    model = summarize(resolve_model("llama-3.2-1b", False))
    report = check_config(
        Path(path), resolve_context(None, 1, None, "24GiB"), None, model, seq_len=1024, grad_checkpointing=False
    )
    assert report.fit is not None
    return planned, report.fit.gpu_peak_bytes


def test_config_offload_ratio_is_predicted_as_written_by_plan_and_check(capsys, tmp_path):
    """A user's ratio 0.3 (with a sub_group_size that cuts ~20 sub-groups) keeps 70% of the optimizer states on the
    GPU: above full offload, below no offload (all three at the same sub_group_size, which also bounds ZeRO-3's
    fp32 step buffer); plan --config and check give the same peak to the byte."""
    size = summarize(resolve_model("llama-3.2-1b", False)).trainable_params // 20
    peaks = {}
    for name, config in (
        ("partial", stage3_offload(0.3, size)),
        ("full", stage3_offload(1.0, size)),
        ("none", stage3_offload(None, size, device=None)),
    ):
        planned, checked = _plan_and_check_peak(capsys, tmp_path, f"{name}.json", config)
        assert planned["estimate"]["gpu_peak_bytes"] == checked
        peaks[name] = checked
        if name == "partial":
            assert planned["candidate"]["mode"]["offload_ratio"] == 0.3
            assert planned["estimate"]["gpu_components"]["partial_offload_states"] > 0
            assert 0 < planned["pinned_host_bytes"] <= planned["estimate"]["host_ram_bytes"]
    assert peaks["full"] < peaks["partial"] < peaks["none"]


def test_config_ratio_is_cut_by_the_users_sub_group_size(capsys, tmp_path):
    """DeepSpeed cuts sub-groups by the config's sub_group_size: with its default 1e9 a 1.2B model is two
    sub-groups per rank, so ratio 0.6 keeps int(0.4 x 2) = 0 on the GPU: the same peak as full offload, and a note."""
    default, _ = _plan_and_check_peak(capsys, tmp_path, "default.json", stage3_offload(0.6, None))
    full, _ = _plan_and_check_peak(capsys, tmp_path, "full.json", stage3_offload(1.0, None))
    fine, _ = _plan_and_check_peak(capsys, tmp_path, "fine.json", stage3_offload(0.6, 50_000_000))
    assert default["estimate"]["gpu_peak_bytes"] == full["estimate"]["gpu_peak_bytes"]
    assert any("keeps nothing on the GPU" in note and "stage3.py:1105" in note for note in default["notes"])
    assert fine["estimate"]["gpu_peak_bytes"] > full["estimate"]["gpu_peak_bytes"]
    assert not any("keeps nothing on the GPU" in note for note in fine["notes"])
    model = summarize(resolve_model("llama-3.2-1b", False))
    path = Path(write(tmp_path, "default.json", stage3_offload(0.6, None)))
    report = check_config(
        path, resolve_context(None, 1, None, "24GiB"), None, model, seq_len=1024, grad_checkpointing=False
    )
    said = [f.message for f in report.findings if f.message.startswith("Memory mode:")]
    assert len(said) == 1 and "keeps nothing on the GPU" in said[0]  # check says it too, as a finding


@needs("deepspeed", "0.18.0", "the config names super_offload, which older DeepSpeed refuses")
def test_config_modes_deepspeed_ignores_are_noted_not_predicted(capsys, tmp_path):
    nvme = stage3_offload(0.5, 10_000_000, device="nvme")
    nvme["zero_optimization"]["offload_optimizer"]["nvme_path"] = str(tmp_path)
    nvme["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": str(tmp_path)}
    planned, _ = _plan_and_check_peak(capsys, tmp_path, "nvme.json", nvme)
    assert "mode" not in planned["candidate"]
    assert any("ratio 0.5 is ignored" in note and "stage3.py:1117-1121" in note for note in planned["notes"])
    zero2 = {**stage2(False), "zero_optimization": {"stage": 2, "zero_hpz_partition_size": 2}}
    zero2["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "super_offload": True}
    planned, _ = _plan_and_check_peak(capsys, tmp_path, "z2.json", zero2)
    assert "mode" not in planned["candidate"]
    assert any("ignored below ZeRO-3" in note and "zero_hpz_partition_size" in note for note in planned["notes"])
    assert any("super_offload" in note and "engine.py:2749" in note for note in planned["notes"])


def test_config_ratio_below_stage_3_is_deepspeeds_refusal(capsys, tmp_path):
    config = {**stage2(True), "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}}
    code, out, err = plan(capsys, *GPT2_ON_24G, "--config", write(tmp_path, "z2r.json", config))
    assert code == 2 and "Partial offloading only supported for ZeRO Stage 3" in err and out == ""


LLAMA_1B_ON_4090 = ("--model", "llama-3.2-1b", "--gpus", "1", "--gpu-type", "rtx-4090", "--seq-len", "1024")
# A partial offload ratio changes the update (autotune.modes.applies.approximation): considered only with the opt-in.
WITH_RATIO = (*LLAMA_1B_ON_4090, "--allow-approximate")


def test_plan_shows_the_modes_as_predictions_after_the_classic_pick(capsys):
    code, out, _ = plan(capsys, *LLAMA_1B_ON_4090)
    assert code == 0 and "offload ratio" not in out and "--allow-approximate" in out  # said, not tried, by default
    code, out, _ = plan(capsys, *WITH_RATIO)
    assert code == 0
    after_pick = out[out.index("Fastest predicted to fit") :]
    assert "Modern modes, predicted (not trial-verified: worth a trial on the target" in after_pick
    ratio_lines = [line for line in after_pick.splitlines() if line.strip().startswith("z3+offload_opt: offload ratio")]
    assert len(ratio_lines) == 1 and "fits at micro-batch" in ratio_lines[0] and "predicted peak" in ratio_lines[0]
    reasons = after_pick[after_pick.index("Modes that do not apply:") :].splitlines()[1:]
    reasons = [line for line in reasons if line.startswith("  ")]
    assert reasons and len(reasons) == len(set(reasons))
    assert any("ZeRO++" in line and "one node" in line for line in reasons)
    code, data = plan_json(capsys, *WITH_RATIO)
    assert "mode" not in data["recommended"]  # a mode is never the pick: no trial measured its speed
    predicted = [p for p in data["modes"]["predicted"] if p["rung"] == "z3+offload_opt" and p["fits"]]
    assert predicted and predicted[0]["mode"].startswith("offload ratio")
    assert len({n["reason"] for n in data["modes"]["not_applicable"]}) == len(data["modes"]["not_applicable"])


def _named_ratio(message: str) -> tuple[float, int]:
    import re

    found = re.search(r"ZeRO-3 \+ optimizer->cpu at offload ratio ([0-9.]+) is predicted to fit at micro-batch (\d+)"
                      r"(?: with checkpointing)? \(not trial-verified here\)", message)  # fmt: skip
    assert found, message
    return float(found.group(1)), int(found.group(2))


def test_nothing_classic_fits_but_partial_offload_does_and_the_message_says_so(capsys, tmp_path):
    """12 GiB of host RAM: full optimizer offload is over it, ZeRO-3 over the GPU; a ratio in between fits both.
    The ratio named is the smallest whose peak + margin fits (host checked too): one step lower does not."""
    args = (*WITH_RATIO, "--host-memory", "14GiB", "--rungs", "z3,z3+offload_opt")
    code, out, err = plan(capsys, *args)
    assert code == 3
    ratio, micro_batch = _named_ratio(err)
    assert _named_ratio(" ".join(out.split())) == (ratio, micro_batch)
    request = TuneRequest.of(
        model="llama-3.2-1b", gpus=1, gpu_type="rtx-4090", seq_len=1024, host_memory="14GiB",
        out=str(tmp_path / "ds.json"), use_cache=False, allow_approximate=True,
    )  # fmt: skip
    ctx = TuneContext.build(request, outputs=False)

    checkpointing = f"micro-batch {micro_batch} with checkpointing" in err

    def verdict(r: float):
        candidate = Candidate(Rung.Z3_OFFLOAD_OPT, micro_batch, checkpointing, Mode(offload_ratio=r))
        return check_fit(estimate(ctx.model, ctx.target, candidate, ctx.settings), ctx.target, 0.9)

    assert verdict(ratio).fits and verdict(round(ratio - 0.05, 2)).limit == "gpu"
    assert verdict(1.0).limit == "host"
    from autotune.errors import NothingFitsError
    from autotune.tuner import tune

    plan_only = request.updated(rungs=(Rung.Z3, Rung.Z3_OFFLOAD_OPT))
    with pytest.raises(NothingFitsError) as raised:
        tune(plan_only)
    assert _named_ratio(str(raised.value)) == (ratio, micro_batch)
    assert not (tmp_path / "ds.json").exists()
