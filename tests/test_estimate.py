"""The memory model against hand calculations and DeepSpeed's own estimator outputs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from tests.fakes.models import LLAMA_70B, summary, target

from autotune.core.ladder import LADDER, Candidate, Rung
from autotune.core.units import GiB
from autotune.estimate import (
    Calibration,
    EstimateSettings,
    calibrate,
    calibrate_oom,
    check_fit,
    eligible_micro_batches,
    estimate,
    largest_micro_batch,
    plan,
)
from autotune.estimate.activations import activation_breakdown, layer_bytes, logits_bytes_per_sample
from autotune.estimate.ds_estimators import compile_estimators, import_estimators
from autotune.estimate.knobs import ZeroKnobs
from autotune.estimate.model_states import model_states

# --- DeepSpeed's estimators -----------------------------------------------------------------------------


def test_compiled_estimators_are_deepspeeds_own_functions():
    compiled, imported = compile_estimators(), import_estimators()
    for args in [(10**9, 8, 1, False), (10**9, 8, 2, True), (12345, 1, 1, False)]:
        assert compiled.zero2(*args) == imported.zero2(*args)
    for args in [
        (10**9, 10**7, 8, 1, False, False),
        (10**9, 10**7, 4, 2, True, True),
        (10**9, 10**7, 8, 1, True, False),
    ]:
        assert compiled.zero3(*args) == imported.zero3(*args)


@pytest.mark.parametrize("gpus,nodes", [(1, 1), (8, 1), (8, 4)])
def test_zero2_and_zero3_states_are_deepspeeds_figures(gpus, nodes):
    ds = import_estimators()
    model = summary()
    where = target(gpus, nodes)
    _, ds_z2 = ds.zero2(model.total_params, gpus, nodes, cpu_offload=False)
    _, ds_z3, _ = ds.zero3(model.total_params, model.largest_layer_params, gpus, nodes, False, False)
    assert model_states(model, where, Rung.Z2, "bf16").device_components["model_states"] == ds_z2
    assert model_states(model, where, Rung.Z3, "bf16").device_components["model_states"] == ds_z3
    _, ds_offload = ds.zero2(model.total_params, gpus, nodes, cpu_offload=True)
    assert model_states(model, where, Rung.Z2_OFFLOAD_OPT, "bf16").device_bytes == ds_offload


def test_stage0_and_zero1_from_per_parameter_bytes():
    """Stage 0: 2 (bf16 weight) + 2 (grad) + 4 (master) + 4 (fp32 grad) + 8 (AdamW) = 20 B/param, on every rank.
    ZeRO-1 keeps weights and 16-bit grads whole and partitions the 16 bytes of fp32 state."""
    params, world = 100_000_000, 8
    model = summary()
    assert model_states(model, target(world), Rung.Z0, "bf16").device_bytes == 20 * params
    assert (
        model_states(model, target(world), Rung.Z1, "bf16").device_bytes
        == 2 * params + 2 * params + 16 * params // world
    )
    assert model_states(model, target(world), Rung.Z2, "bf16").device_bytes == 2 * params + 18 * params // world


def test_fp32_stage0_has_no_master_copy():
    model = summary()
    assert model_states(model, target(), Rung.Z0, "fp32").device_bytes == 16 * model.total_params  # 4 + 4 + 8


def test_frozen_parameters_have_no_gradients_or_optimizer_states():
    frozen = summary(trainable_params=20_000_000)  # 80M frozen
    states = model_states(frozen, target(), Rung.Z0, "bf16")
    assert states.device_components["frozen_params"] == 2 * 80_000_000
    assert states.device_bytes == 20 * 20_000_000 + 2 * 80_000_000
    z3 = model_states(frozen, target(8), Rung.Z3, "bf16")
    assert z3.device_components["frozen_params"] == 2 * 80_000_000 // 8


def test_offloaded_states_land_on_host_and_nvme():
    model, world = summary(), 4
    params = model.total_params
    z2 = model_states(model, target(world), Rung.Z2_OFFLOAD_OPT, "bf16")
    # fp32 master + 16-bit copy-back buffer + fp32 grad (pinned) + Adam moments (pageable), partitioned
    assert z2.host_bytes == 18 * params // world and z2.host_pageable_bytes == 8 * params // world
    all_cpu = model_states(model, target(world), Rung.Z3_OFFLOAD_ALL, "bf16")
    # DeepSpeed's estimator's 18 (fp32 master, fp32 grad, moments, 16-bit params) + the 16-bit gradient
    # partitions' flat buffer (stage3.py:790-795) it leaves out; master and moments are pageable
    assert all_cpu.host_bytes == 20 * params // world and all_cpu.host_pageable_bytes == 12 * params // world
    assert all_cpu.device_components["model_states"] == 4 * model.largest_layer_params
    nvme_opt = model_states(model, target(world), Rung.Z3_NVME_OPT, "bf16")
    assert (nvme_opt.nvme_bytes, nvme_opt.host_bytes) == (16 * params // world, 2 * params // world)
    nvme_all = model_states(model, target(world), Rung.Z3_NVME_ALL, "bf16")
    assert (nvme_all.nvme_bytes, nvme_all.host_bytes) == (18 * params // world, 0)


# --- activations and logits: hand calculations --------------------------------------------------------


def test_eager_gpt_layer_matches_korthikanti():
    """Korthikanti et al. 2022: s*b*h*(34 + 5*a*s/h) bytes per layer in 16-bit with eager attention."""
    model = summary()
    s, h, a = 512, model.hidden_size, model.num_heads
    settings = EstimateSettings(seq_len=s, precision="bf16", attention="eager", device="cuda")
    assert layer_bytes(model, settings) == s * h * 34 + 5 * a * s * s


def test_fused_attention_drops_the_s_squared_term():
    model = summary()
    s, h = 512, model.hidden_size
    settings = EstimateSettings(seq_len=s, precision="bf16", attention="sdpa", device="cuda")
    assert layer_bytes(model, settings) == s * h * (34 + 2)  # + the kernel output it keeps (2 bytes x s*h)
    flash = replace(settings, attention="flash")
    assert layer_bytes(model, flash) == layer_bytes(model, settings)


def test_gqa_shrinks_keys_and_values():
    llama = LLAMA_70B
    mha = replace(llama, num_kv_heads=llama.num_heads)
    settings = EstimateSettings(seq_len=1024, precision="bf16")
    saved = layer_bytes(mha, settings) - layer_bytes(llama, settings)
    assert saved == 2 * 2 * (64 - 8) * 128 * 1024  # K and V, 2 bytes, 56 fewer heads of 128, 1024 tokens


def test_logits_and_loss_bytes():
    model = summary()
    settings = EstimateSettings(seq_len=2048, precision="bf16")
    assert logits_bytes_per_sample(model, settings) == 12 * 32000 * 2048  # fp32 log-softmax + 2 fp32 grads
    t5 = summary(family="encoder-decoder", model_type="t5", config={"model_type": "t5"}, num_decoder_layers=8)
    assert logits_bytes_per_sample(t5, settings) == 3 * 2 * 32000 * 2048  # no upcast in T5's loss


def test_checkpointing_keeps_layer_inputs_and_one_layer():
    model = summary()
    settings = EstimateSettings(seq_len=1024, precision="bf16")
    plain = activation_breakdown(model, settings, grad_checkpointing=False)
    ckpt = activation_breakdown(model, settings, grad_checkpointing=True)
    one_layer = layer_bytes(model, settings)
    outside = plain.saved_per_sample - model.num_layers * one_layer
    assert ckpt.saved_per_sample == model.num_layers * 2 * 1024 * 1024 + outside
    assert ckpt.layer_window_per_sample - plain.layer_window_per_sample == one_layer
    assert ckpt.total(4) < plain.total(4)


def test_activations_scale_with_micro_batch():
    model = summary()
    settings = EstimateSettings(seq_len=1024)
    one = estimate(model, target(), Candidate(Rung.Z2, 1), settings).gpu_components
    four = estimate(model, target(), Candidate(Rung.Z2, 4), settings).gpu_components
    assert four["activations"] == 4 * one["activations"]
    assert four["logits"] == 4 * one["logits"]
    assert four["model_states"] == one["model_states"]


# --- estimate, check_fit, search --------------------------------------------------------------------------


def test_optimizer_step_and_activations_do_not_coexist():
    """DeepSpeed counts the fp32 gradients as resident; they exist only in the step, after backward.

    Short sequences: the step dominates, and stage 0 peaks at 24 B/param (FP16_Optimizer's per-parameter
    fp32 copies plus their flattened copy). Long sequences: activations dominate, fp32 grads drop out.
    """
    model = summary()
    params = model.total_params
    short = estimate(model, target(), Candidate(Rung.Z0, 1), EstimateSettings(seq_len=8))
    parts = short.gpu_components
    states_at_step = parts["model_states"] + parts["phase_overlap"] + parts["activations"] + parts["logits"]
    assert states_at_step == 24 * params
    long = estimate(model, target(), Candidate(Rung.Z0, 8), EstimateSettings(seq_len=2048))
    assert long.gpu_components["phase_overlap"] == -4 * params  # the fp32 gradient copy


def test_fp32_stage0_gradients_are_made_during_backward():
    """fp32 without ZeRO: the engine sets param.grad = None after each step, so in backward the activations
    coexist with the output layer's gradient, not with all of them (engine.py:3529-3530, measured gpt2)."""
    model = summary()
    grads, first = 4 * model.trainable_params, 4 * model.largest_layer_params
    fp32 = EstimateSettings(seq_len=2048, precision="fp32")
    long = estimate(model, target(), Candidate(Rung.Z0, 8), fp32)
    activations = long.gpu_components["activations"] + long.gpu_components["logits"]
    assert activations > grads  # backward dominates: all gradients but the first overlap the activations
    assert long.gpu_components["phase_overlap"] == -(grads - first)
    # ZeRO keeps its gradient partitions across steps: no such overlap at stage 2
    stage2 = estimate(model, target(), Candidate(Rung.Z2, 8), fp32)
    assert stage2.gpu_components.get("phase_overlap", 0) > -(grads - first)
    # bf16 goes through BF16_Optimizer, whose fp32 gradient accumulators persist: unchanged by this rule
    bf16 = estimate(model, target(), Candidate(Rung.Z0, 8), EstimateSettings(seq_len=2048))
    assert bf16.gpu_components["phase_overlap"] == -4 * model.trainable_params


def test_components_add_up_and_deepspeed_alone_is_reported():
    model = summary()
    predicted = estimate(model, target(8), Candidate(Rung.Z2, 2), EstimateSettings(seq_len=1024))
    assert predicted.gpu_peak_bytes == sum(predicted.gpu_components.values())
    assert predicted.deepspeed_estimate_bytes == predicted.gpu_components["model_states"]
    for name in ("cuda_context", "nccl_buffers", "allocator_slack", "reduce_buckets", "activations", "logits"):
        assert predicted.gpu_components[name] > 0
    # stages 1-2: two reduce buffers (overlap_comm) of 2e8 elements, 2 bytes each
    assert predicted.gpu_components["reduce_buckets"] == 2 * 200_000_000 * 2
    assert predicted.gpu_peak_bytes > 1.5 * predicted.deepspeed_estimate_bytes


def test_cpu_backend_counts_everything_in_the_process():
    model = summary()
    settings = EstimateSettings(seq_len=256, device="cpu")
    predicted = estimate(model, target(2), Candidate(Rung.Z3_OFFLOAD_ALL, 1), settings)
    components = predicted.gpu_components
    assert components["offloaded_states"] + components["offloaded_optimizer_moments"] == 20 * model.total_params // 2
    assert "cuda_context" not in components and "process_baseline" in components
    assert predicted.host_ram_bytes == 2 * predicted.gpu_peak_bytes
    assert predicted.device == "cpu"


def test_check_fit_limits_and_reasons():
    model = summary()
    where = target(8, memory=80 * GiB)
    predicted = estimate(model, where, Candidate(Rung.Z2, 1), EstimateSettings(seq_len=1024))
    needed = predicted.gpu_peak_bytes + predicted.gpu_margin_bytes  # a GPU "fits" must hold with the margin
    assert predicted.gpu_margin_bytes > 0
    exact = replace(where, free_memory_bytes=int(needed / 0.9) + 1)
    assert check_fit(predicted, exact, 0.9).fits
    without_margin = replace(where, free_memory_bytes=int(predicted.gpu_peak_bytes / 0.9) + 1)
    assert not check_fit(predicted, without_margin, 0.9).fits
    tight = replace(where, free_memory_bytes=predicted.gpu_peak_bytes)
    verdict = check_fit(predicted, tight, 0.9)
    assert not verdict.fits and verdict.limit == "gpu" and "GPU peak" in verdict.reason and "90%" in verdict.reason
    assert "margin" in verdict.reason
    assert verdict.shortfall_bytes == needed - int(0.9 * predicted.gpu_peak_bytes)
    small_host = replace(where, host_ram_bytes=1)
    host_verdict = check_fit(predicted, small_host, 0.9)
    assert not host_verdict.fits and host_verdict.limit == "host" and "host RAM" in host_verdict.reason


def test_nvme_rungs_need_known_space():
    model = summary()
    settings = EstimateSettings(seq_len=1024)
    predicted = estimate(model, target(8), Candidate(Rung.Z3_NVME_OPT, 1), settings)
    unknown = check_fit(predicted, target(8), 0.9)
    assert not unknown.fits and unknown.limit == "nvme_unknown" and "--nvme-path" in unknown.reason
    assert check_fit(predicted, target(8, nvme_free_bytes=10**15), 0.9).fits
    small = check_fit(predicted, target(8, nvme_free_bytes=1), 0.9)
    assert not small.fits and small.limit == "nvme"


def test_largest_micro_batch_matches_a_linear_scan():
    model, where, settings = summary(), target(8, memory=40 * GiB), EstimateSettings(seq_len=1024)
    found = largest_micro_batch(model, where, Rung.Z2, False, settings=settings, limit=64)
    fits = [m for m in range(1, 65) if check_fit(estimate(model, where, Candidate(Rung.Z2, m), settings), where).fits]
    assert found == max(fits)
    assert largest_micro_batch(model, target(8, memory=GiB), Rung.Z2, False, settings=settings) is None


def test_global_batch_restricts_micro_batches():
    assert eligible_micro_batches(4, 32, 64) == [1, 2, 4, 8]
    assert eligible_micro_batches(3, 32, 64) == []
    model, where, settings = summary(), target(4, memory=80 * GiB), EstimateSettings(seq_len=512)
    free = largest_micro_batch(model, where, Rung.Z2, True, settings=settings)
    bounded = largest_micro_batch(model, where, Rung.Z2, True, settings=settings, global_batch=32)
    assert bounded in (1, 2, 4, 8) and bounded <= free


def test_plan_rows_in_ladder_order_and_json():
    result = plan(summary(), target(8), EstimateSettings(seq_len=1024), global_batch=64)
    assert [(r.rung, r.grad_checkpointing) for r in result.rows] == [(r, c) for r in LADDER for c in (False, True)]
    for row in result.rows:
        assert row.estimate.candidate.micro_batch == (row.micro_batch or 1)
        assert row.verdict.fits == (row.micro_batch is not None)
    data = json.loads(json.dumps(result.to_dict()))
    assert len(data["rows"]) == 18 and "config" not in data["model"]


def test_plan_for_70b_on_8_a100():
    result = plan(LLAMA_70B, target(8, memory=80 * GiB), EstimateSettings(seq_len=4096))
    by_key = {(r.rung, r.grad_checkpointing): r for r in result.rows}
    assert by_key[(Rung.Z3, True)].micro_batch is None  # 18 B/param / 8 ranks > 80 GiB
    assert by_key[(Rung.Z3_OFFLOAD_OPT, True)].micro_batch  # offloading the optimizer makes room
    assert all(r.micro_batch is None for r in result.rows if r.rung.stage < 3)


# --- calibration ----------------------------------------------------------------------------------------


def test_calibrate_matches_one_trial_and_leaves_input_alone():
    model, where, settings = summary(), target(8), EstimateSettings(seq_len=1024)
    candidate = Candidate(Rung.Z2, 4)
    measured = estimate(model, where, candidate, settings).gpu_peak_bytes + 3 * GiB
    start = Calibration()
    learned = calibrate(start, model, where, candidate, settings=settings, measured_peak_bytes=measured)
    assert start == Calibration()
    assert learned.samples == 1
    assert abs(estimate(model, where, candidate, settings, calibration=learned).gpu_peak_bytes - measured) <= 1


def test_calibrate_fits_slope_and_fixed_part_from_two_micro_batches():
    model, where, settings = summary(), target(8), EstimateSettings(seq_len=1024)
    small, large = Candidate(Rung.Z2, 2), Candidate(Rung.Z2, 6)

    def truth(candidate: Candidate) -> int:  # a "real" machine: activations 30% heavier, 1 GiB more overhead
        parts = estimate(model, where, candidate, settings).gpu_components
        variable = parts["activations"] + parts["logits"] + parts.get("backward_window", 0)
        return sum(parts.values()) + int(0.3 * variable) + GiB

    calibration = Calibration()
    for candidate in (small, large):
        calibration = calibrate(
            calibration, model, where, candidate, settings=settings, measured_peak_bytes=truth(candidate)
        )
    assert calibration.activation_scale(False) == pytest.approx(1.3, rel=1e-3)
    for candidate in (small, large, Candidate(Rung.Z2, 4)):
        predicted = estimate(model, where, candidate, settings, calibration=calibration).gpu_peak_bytes
        assert predicted == pytest.approx(truth(candidate), rel=1e-4)


def test_activation_margins_shrink_only_after_a_trial_of_the_same_checkpointing_setting():
    """A trial without checkpointing measures that setting's activations; a checkpointed candidate's activations
    (layer inputs, one layer rebuilt at a time) stay as uncertain as before it, while the rest of its margin (model
    states, buffers), which the trial did measure, shrinks like everyone's."""
    model, where, settings = summary(), target(8), EstimateSettings(seq_len=1024)
    plain, checkpointed = Candidate(Rung.Z2, 4), Candidate(Rung.Z2, 4, True)
    measured = estimate(model, where, plain, settings).gpu_peak_bytes
    calibration = calibrate(Calibration(), model, where, plain, settings=settings, measured_peak_bytes=measured)
    assert calibration.measured(False) and not calibration.measured(True)
    bounded = calibrate_oom(
        calibration, model, where, Candidate(Rung.Z2, 64, True), settings=settings, limit_bytes=10 * measured
    )
    assert not bounded.measured(True)  # an OOM is a lower bound, not a measurement of the setting

    def margins(candidate: Candidate, learned: Calibration | None) -> dict[str, int]:
        return estimate(model, where, candidate, settings, calibration=learned).gpu_uncertainty

    before, after = margins(checkpointed, None), margins(checkpointed, calibration)
    assert after["activations"] == before["activations"] > 0
    assert after["model_states"] == pytest.approx(before["model_states"] / 2, abs=1)
    plain_before, plain_after = margins(plain, None), margins(plain, calibration)
    assert plain_after["activations"] == pytest.approx(plain_before["activations"] / 2, abs=1)


def test_each_checkpointing_setting_learns_its_own_slope():
    """Full checkpointing keeps layer inputs, not activations: a ratio measured without it does not hold with it. A
    setting borrows the other's slope until its own trials run, then each is predicted by its own line, and an OOM
    of one setting steepens that setting's slope alone."""
    model, where, settings = summary(), target(8), EstimateSettings(seq_len=1024)
    ratio = {False: 0.7, True: 1.0}  # true activations over the model's, per setting; 1 GiB more overhead in both

    def truth(candidate: Candidate) -> int:
        parts = estimate(model, where, candidate, settings).gpu_components
        variable = parts["activations"] + parts["logits"] + parts.get("backward_window", 0)
        return sum(parts.values()) + round((ratio[candidate.grad_checkpointing] - 1) * variable) + GiB

    calibration = Calibration()
    for candidate in (Candidate(Rung.Z2, 2), Candidate(Rung.Z2, 6)):
        calibration = calibrate(
            calibration, model, where, candidate, settings=settings, measured_peak_bytes=truth(candidate)
        )
    assert calibration.activation_scale(False) == pytest.approx(0.7, rel=1e-3)
    assert calibration.activation_scale(True) == calibration.activation_scale(False)  # borrowed: nothing of its own
    for candidate in (Candidate(Rung.Z2, 2, True), Candidate(Rung.Z2, 6, True)):
        calibration = calibrate(
            calibration, model, where, candidate, settings=settings, measured_peak_bytes=truth(candidate)
        )
    assert calibration.activation_scale(True) == pytest.approx(1.0, rel=1e-3)
    assert calibration.activation_scale(False) == pytest.approx(0.7, rel=1e-3)
    for candidate in (Candidate(Rung.Z2, 4), Candidate(Rung.Z2, 4, True)):
        predicted = estimate(model, where, candidate, settings, calibration=calibration).gpu_peak_bytes
        assert predicted == pytest.approx(truth(candidate), rel=1e-4)
    failed = Candidate(Rung.Z2, 12, True)
    bounded = calibrate_oom(calibration, model, where, failed, settings=settings, limit_bytes=truth(failed) + 4 * GiB)
    assert bounded.activation_scale(True) > 1.0
    assert bounded.activation_scale(False) == calibration.activation_scale(False)


def test_pinned_offload_tensors_cost_a_power_of_two_on_cuda():
    """torch's CUDA host allocator rounds each pinned tensor up (CachingHostAllocator.h, PowerOf2Ceil): three
    pinned stage-2 tensors of a 7B partition on one GPU take 32 + 16 + 32 GiB, not 26 + 13 + 26."""
    from autotune.estimate.pinned import pinned_host_bytes, power_of_two_ceil

    assert [power_of_two_ceil(n) for n in (0, 1, 3, 4, 5, 2**30 + 1)] == [0, 1, 4, 4, 8, 2**31]
    model = replace(summary(), total_params=7_000_000_000, trainable_params=7_000_000_000)
    plain = model_states(model, target(1), Rung.Z2_OFFLOAD_OPT, "bf16")
    pinned = model_states(model, target(1), Rung.Z2_OFFLOAD_OPT, "bf16", pinned_rounding=True)
    assert plain.host_bytes == 18 * 7_000_000_000
    assert pinned.host_bytes - pinned.host_pageable_bytes == 2**35 + 2**34 + 2**35
    assert pinned.host_pageable_bytes == plain.host_pageable_bytes == 8 * 7_000_000_000
    # through estimate(): a GPU run with pin_memory rounds, the CPU backend and pin_memory false do not
    candidate = Candidate(Rung.Z2_OFFLOAD_OPT, 1)
    gpu = estimate(model, target(1), candidate, EstimateSettings(seq_len=128, device="cuda"))
    unpinned = EstimateSettings(seq_len=128, device="cuda", knobs=ZeroKnobs(pin_memory=False))
    assert gpu.host_components["offloaded_states"] == 2**35 + 2**34 + 2**35
    assert estimate(model, target(1), candidate, unpinned).host_components["offloaded_states"] == 10 * 7_000_000_000
    assert pinned_host_bytes(gpu.host_components) == 2**35 + 2**34 + 2**35 + gpu.host_components["offload_grad_staging"]


def test_stage3_pinned_gradients_round_per_sub_group():
    """ZeRO-3 pins one fp32 gradient buffer per sub-group (stage3.py:1337-1342), cut from the rank's share by
    sub_group_size: smaller sub-groups round to smaller powers of two."""
    from autotune.estimate.model_states import offloaded_stage3_host

    one_group, _ = offloaded_stage3_host(3_000_000_000, 1, "bf16", 1_000_000_000_000, offload_param=False, rounded=True)
    assert one_group == 2**34 + 2**33  # 12 GB fp32 gradients -> 16 GiB; 6 GB 16-bit flat buffer -> 8 GiB
    three_groups, pageable = offloaded_stage3_host(
        3_000_000_000, 1, "bf16", 1_000_000_000, offload_param=False, rounded=True
    )
    assert three_groups == 3 * 2**32 + 2**33 and pageable == 12 * 3_000_000_000
    exact, _ = offloaded_stage3_host(3_000_000_000, 1, "bf16", 1_000_000_000, offload_param=True, rounded=False)
    assert exact == (4 + 2 + 2) * 3_000_000_000  # with parameters offloaded: their 16-bit partitions pinned too
