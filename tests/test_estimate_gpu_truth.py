"""The GPU-side memory model: ds_config knobs, stack-dependent runtime overheads, the margin a GPU "fits" needs,
ZeRO-3 parameter retention, and OOM trials as lower bounds. Hand-built summaries: no transformers needed,
except the published-set check (slow) which runs benchmarks/published_accuracy.py's model on every point."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from tests.fakes.models import summary, target

from autotune.core.ladder import Candidate, Rung
from autotune.core.units import GiB
from autotune.estimate import (
    Calibration,
    EstimateSettings,
    calibrate,
    calibrate_oom,
    check_fit,
    estimate,
    largest_micro_batch,
)
from autotune.estimate.activations import layer_bytes, logits_bytes_per_sample
from autotune.estimate.buffers import PARAMETER_SIZED_COMPONENTS, reserve_left_after_reuse
from autotune.estimate.knobs import DS_DEFAULT_BUCKET, DS_DEFAULT_PREFETCH, ZeroKnobs
from autotune.estimate.model_states import model_states
from autotune.estimate.runtime import (
    ALLOCATOR_OBSERVATIONS,
    CONTEXT_EAGER,
    CONTEXT_LAZY,
    NCCL_MORE_RANKS,
    NCCL_TWO_RANKS,
    NVLS_BYTES_PER_HEAD,
    RuntimeStack,
    allocator_reserve_fraction,
    allocator_reserve_margin_fraction,
    cuda_context,
    lazy_loading,
    nccl_buffers,
    nvls_buffers,
)
from autotune.estimate.stage3_retention import retained_at_turn

REPO = Path(__file__).resolve().parents[1]
NEW_STACK = RuntimeStack(torch_version="2.7.1+cu126", cuda_version="12.6", nccl_version="2.26.2")


# --- knobs from a ds_config ------------------------------------------------------------------------------


def test_knobs_fill_auto_like_hf_trainer_and_absent_keys_with_deepspeed_defaults():
    zero = {"reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto", "stage3_max_live_parameters": "1e9"}
    knobs = ZeroKnobs.from_ds_config(zero, hidden_size=4096, stage=3, gradient_accumulation_steps=2)
    assert knobs.reduce_bucket_size == 4096 * 4096
    assert knobs.stage3_prefetch_bucket_size == int(0.9 * 4096 * 4096)
    assert knobs.stage3_param_persistence_threshold == 100_000  # absent: DeepSpeed's default
    assert knobs.stage3_max_live_parameters == 10**9
    assert knobs.overlap_comm is True  # DeepSpeed turns it on at stage 3 when unset
    assert knobs.gradient_accumulation_steps == 2
    stage2 = ZeroKnobs.from_ds_config({}, hidden_size=4096, stage=2)
    assert stage2.reduce_bucket_size == DS_DEFAULT_BUCKET and stage2.overlap_comm is False
    assert ZeroKnobs.from_ds_config({}, None, 3).stage3_prefetch_bucket_size == DS_DEFAULT_PREFETCH


def test_unknown_optimizer_kind_is_refused():
    with pytest.raises(ValueError, match="unknown optimizer kind"):
        _ = ZeroKnobs(optimizer="sgd-with-magic").step_temporary_bytes_per_element


def test_bigger_reduce_bucket_and_overlap_comm_cost_what_they_hold():
    model, where = summary(), target(8)
    candidate = Candidate(Rung.Z2, 1)
    small = EstimateSettings(seq_len=512, knobs=ZeroKnobs(reduce_bucket_size=10**8, overlap_comm=False))
    double = EstimateSettings(seq_len=512, knobs=ZeroKnobs(reduce_bucket_size=10**8, overlap_comm=True))
    a = estimate(model, where, candidate, small).gpu_components["reduce_buckets"]
    b = estimate(model, where, candidate, double).gpu_components["reduce_buckets"]
    assert (a, b) == (2 * 10**8, 4 * 10**8)  # elements x 2 bytes, twice with overlap_comm


def test_zero1_full_gradient_only_without_overlap_or_with_accumulation():
    model, where = summary(), target(8)
    params = model.trainable_params
    full = 2 * params - 2 * params // 8

    def extra(knobs: ZeroKnobs) -> int:
        return model_states(model, where, Rung.Z1, "bf16", knobs=knobs).device_components.get(
            "zero1_unpartitioned_grads", 0
        )

    assert extra(ZeroKnobs(overlap_comm=True, gradient_accumulation_steps=1)) == 0
    assert extra(ZeroKnobs(overlap_comm=True, gradient_accumulation_steps=4)) == full
    assert extra(ZeroKnobs(overlap_comm=False, gradient_accumulation_steps=1)) == full
    assert extra(ZeroKnobs()) == full  # accumulation unknown: counted


@pytest.mark.parametrize(
    ("version", "ignored"),
    [("0.4.3", False), ("0.4.4", True), ("0.9.5", True), ("0.12.6", True), ("0.13.1", False), (None, False)],
)
def test_deepspeed_before_0_13_ran_zero1_without_overlap_or_contiguous_buffers(version: str | None, ignored: bool):
    """engine.py of 0.4.4-0.12.6 forces both flags off at stage 1: no reduce buffers, the full gradient kept."""
    model, where = summary(), target(8)
    knobs = ZeroKnobs(overlap_comm=True, contiguous_gradients=True, gradient_accumulation_steps=1)
    settings = EstimateSettings(seq_len=512, knobs=knobs, stack=RuntimeStack(deepspeed_version=version))
    parts = estimate(model, where, Candidate(Rung.Z1, 1), settings).gpu_components
    assert ("reduce_buckets" in parts) is not ignored
    assert ("zero1_unpartitioned_grads" in parts) is ignored
    stage2 = estimate(model, where, Candidate(Rung.Z2, 1), settings).gpu_components
    assert stage2["reduce_buckets"] > 0  # stage 2 always honoured them


def test_torch_foreach_adamw_step_temporary_and_stage3_sub_group_bound():
    model, where = summary(), target(8)
    partition = model.trainable_params // 8
    fused = model_states(model, where, Rung.Z2, "bf16", knobs=ZeroKnobs(optimizer="fused"))
    foreach = model_states(model, where, Rung.Z2, "bf16", knobs=ZeroKnobs(optimizer="torch_foreach"))
    assert foreach.step_temporary_bytes - fused.step_temporary_bytes == 4 * partition
    whole = model_states(model, where, Rung.Z3, "bf16", knobs=ZeroKnobs())
    grouped = model_states(model, where, Rung.Z3, "bf16", knobs=ZeroKnobs(sub_group_size=partition // 4))
    assert whole.step_only_bytes == 4 * partition
    assert grouped.step_only_bytes == 4 * (partition // 4)  # one sub-group's fp32 gradient at a time


# --- ZeRO-3 keeps gathered parameters -----------------------------------------------------------------------


def test_small_model_at_zero3_keeps_every_gathered_parameter():
    model, where = summary(), target(2)  # 100M parameters, far under the default reuse distance
    parts = estimate(model, where, Candidate(Rung.Z3, 1), EstimateSettings(seq_len=512)).gpu_components
    assert parts["live_params"] == 2 * model.total_params


def test_large_model_keeps_what_the_trace_replay_keeps():
    model, where = summary(total_params=20 * 10**9, trainable_params=20 * 10**9), target(8)
    settings = EstimateSettings(seq_len=512)
    for checkpointing in (False, True):
        parts = estimate(model, where, Candidate(Rung.Z3, 1, checkpointing), settings).gpu_components
        retained = retained_at_turn(model, settings.knobs.stage3_max_reuse_distance, checkpointing)
        assert 0 < retained < model.total_params and parts["live_params"] == 2 * retained
    no_reuse = replace(settings, knobs=ZeroKnobs(stage3_max_reuse_distance=0))
    parts = estimate(model, where, Candidate(Rung.Z3, 1), no_reuse).gpu_components
    assert "live_params" not in parts and parts["prefetched_params"] > 0


def test_one_rank_at_zero3_gathers_nothing_unless_parameters_are_offloaded():
    model = summary()
    one, two = target(1), target(2)
    settings = EstimateSettings(seq_len=512)

    def gathered(where, rung):
        parts = estimate(model, where, Candidate(rung, 1), settings).gpu_components
        return sum(parts.get(name, 0) for name in ("live_params", "prefetched_params", "persistent_params"))

    assert gathered(one, Rung.Z3) == 0  # the gathered parameter is the partition itself (NoGatherHandle)
    assert gathered(two, Rung.Z3) > 0
    assert gathered(one, Rung("z3+offload_opt+param")) > 0  # the partition lives in host RAM: copied to the GPU


@pytest.mark.parametrize("total", [100_000_000, 4_000_000_000])
def test_unknown_zero_init_widens_the_stage3_margin_by_the_unreused_16bit_model(total):
    """Without zero.Init the whole cast model is cached once; an unknown zero.Init widens the margin by the same."""
    model, where = summary(total_params=total, trainable_params=total), target(8)
    known = EstimateSettings(seq_len=512, knobs=ZeroKnobs(zero_init=True))
    unknown = EstimateSettings(seq_len=512, knobs=ZeroKnobs(zero_init=None))
    without = EstimateSettings(seq_len=512, knobs=ZeroKnobs(zero_init=False))
    candidate = Candidate(Rung.Z3, 1)
    a, b = estimate(model, where, candidate, known), estimate(model, where, candidate, unknown)
    assert b.gpu_peak_bytes == a.gpu_peak_bytes
    c = estimate(model, where, candidate, without)
    left = c.gpu_components.get("unpartitioned_model_reserve", 0)
    assert left == reserve_left_after_reuse(2 * total, c.gpu_components, model, 1, settings=without)
    assert b.gpu_uncertainty.get("zero_init_unknown", 0) == left
    reusing = sum(c.gpu_components.get(name, 0) for name in PARAMETER_SIZED_COMPONENTS)
    assert reusing > 0 and left <= max(0, 2 * total - reusing)
    assert (left > 0) == (total > 1_000_000_000)  # a small model's gathered parameters fill its cached blocks
    z2 = estimate(model, where, Candidate(Rung.Z2, 1), unknown)
    assert "zero_init_unknown" not in z2.gpu_uncertainty  # only stage 3 partitions parameters


def test_the_cached_whole_model_is_reused_by_tensors_that_fit_its_blocks():
    """Without zero.Init the whole 16-bit model's freed blocks stay cached; gathered parameters, their gradients and
    small activations land in them, so reserved memory is the reserve or those tensors, not both."""
    model = summary(total_params=4_000_000_000, trainable_params=4_000_000_000)
    settings = EstimateSettings(seq_len=512)
    reserve = 2 * model.total_params
    small = {"live_params": 100, "weight_grad_transient": 50, "activations": 30, "logits": 20, "model_states": 10**9}
    fits = reserve_left_after_reuse(reserve, small, model, 1, settings=settings)
    tokens_fit = 512 * max(model.hidden_size, model.intermediate_size) <= model.largest_layer_params
    logits_fit = 512 * model.vocab_size * 4 <= model.largest_layer_params * 2
    assert fits == reserve - 150 - (30 if tokens_fit else 0) - (20 if logits_fit else 0)  # never the flat states
    assert (
        reserve_left_after_reuse(reserve, small, model, 10**6, settings=settings) == reserve - 150
    )  # no block holds these
    assert reserve_left_after_reuse(100, {"live_params": 10**9}, model, 1, settings=settings) == 0
    z3 = Candidate(Rung.Z3, 1)
    with_init = estimate(model, target(8), z3, replace(settings, knobs=ZeroKnobs(zero_init=True)))
    without = estimate(model, target(8), z3, replace(settings, knobs=ZeroKnobs(zero_init=False)))
    tensors = sum(v for k, v in without.gpu_components.items() if k != "allocator_slack")
    tensors_init = sum(v for k, v in with_init.gpu_components.items() if k != "allocator_slack")
    assert tensors - tensors_init == without.gpu_components["unpartitioned_model_reserve"] > 0


# --- runtime overheads follow the stack ----------------------------------------------------------------------


def test_cuda_context_follows_lazy_loading():
    assert lazy_loading(NEW_STACK) is True
    assert lazy_loading(RuntimeStack(torch_version="1.12.1", cuda_version="11.6")) is False
    assert lazy_loading(RuntimeStack()) is None
    assert cuda_context(NEW_STACK).central == CONTEXT_LAZY
    assert cuda_context(RuntimeStack(torch_version="1.12.1", cuda_version="11.3")).central == CONTEXT_EAGER
    unknown = cuda_context(RuntimeStack())
    assert unknown.central == CONTEXT_LAZY and unknown.central + unknown.uncertainty == CONTEXT_EAGER


def test_nccl_counts_communicators_by_version_and_hopper_nvls():
    assert nccl_buffers(1, NEW_STACK).central == 0
    assert nccl_buffers(2, NEW_STACK).central == NCCL_TWO_RANKS
    old = nccl_buffers(8, RuntimeStack(nccl_version="2.18.1"))
    assert old.central == 2 * NCCL_MORE_RANKS  # eager connect: both communicators set up
    unknown = nccl_buffers(8, RuntimeStack())
    assert unknown.central == NCCL_MORE_RANKS and unknown.uncertainty == NCCL_MORE_RANKS
    # Hopper's NVLS buffers are their own component (nvls_buffers), not in these figures
    assert nccl_buffers(8, replace(NEW_STACK, compute_capability="9.0")) == nccl_buffers(8, NEW_STACK)


def test_nvls_buffers_follow_nccl_gpu_count_and_hopper():
    hopper = replace(NEW_STACK, compute_capability="9.0")
    per_comm = NVLS_BYTES_PER_HEAD * 8  # 2,415,919,104 B on 8 x H200 (vllm-project/vllm#9699)
    assert per_comm == 2_415_919_104
    lazy = nvls_buffers(8, hopper)  # NCCL 2.26: set up at the first NVLS collective
    assert (lazy.central, lazy.uncertainty) == (per_comm, per_comm)
    eager = nvls_buffers(8, replace(hopper, nccl_version="2.21.5"))  # set up with each communicator
    assert (eager.central, eager.uncertainty) == (2 * per_comm, 0)
    assert nvls_buffers(4, hopper).central == NVLS_BYTES_PER_HEAD * 4  # one head per local GPU
    assert nvls_buffers(2, hopper).central == 0  # ncclNvlsInit: no NVLS at two GPUs or fewer
    assert nvls_buffers(8, NEW_STACK).central == 0  # compute capability unknown
    assert nvls_buffers(8, replace(hopper, compute_capability="8.0")).central == 0  # A100: no multicast
    assert nvls_buffers(8, replace(hopper, nccl_version="2.16.5")).central == 0  # before NVLS


def test_nvls_buffers_reach_the_estimate_outside_the_allocator_terms():
    model = summary()
    candidate = Candidate(Rung.Z3, micro_batch=1, grad_checkpointing=True)
    base = EstimateSettings(seq_len=512, precision="bf16", stack=replace(NEW_STACK, nccl_version="2.21.5"))
    hopper = replace(base, stack=replace(base.stack, compute_capability="9.0"))
    plain = estimate(model, target(gpus=8), candidate, base)
    nvls = estimate(model, target(gpus=8), candidate, hopper)
    assert nvls.gpu_components["nccl_nvls_buffers"] == 2 * NVLS_BYTES_PER_HEAD * 8
    assert nvls.gpu_peak_bytes - plain.gpu_peak_bytes == 2 * NVLS_BYTES_PER_HEAD * 8  # no allocator slack on it
    assert nvls.gpu_unpressured_extra_bytes == plain.gpu_unpressured_extra_bytes


def test_local_stack_reads_package_metadata(monkeypatch: pytest.MonkeyPatch):
    from autotune.estimate import runtime

    versions = {"torch": "2.13.0+cu130", "nvidia-nccl-cu13": "2.28.3"}
    monkeypatch.setattr(runtime, "_installed", versions.get)
    stack = runtime.local_stack("9.0")
    assert stack == RuntimeStack("2.13.0+cu130", "13.0", "2.28.3", "9.0")
    assert lazy_loading(stack) is True
    monkeypatch.setattr(runtime, "_installed", {"torch": "2.13.0+cpu"}.get)
    assert runtime.local_stack() == RuntimeStack("2.13.0+cpu", None, None, None)


def test_allocator_reserve_comes_from_the_cited_observations():
    fractions = sorted(reserved / allocated - 1 for allocated, reserved, _ in ALLOCATOR_OBSERVATIONS)
    assert fractions[len(fractions) // 2 - 1] <= allocator_reserve_fraction() <= fractions[len(fractions) // 2]
    assert 0 < allocator_reserve_margin_fraction() < 0.1


def test_estimate_uses_the_stack_it_is_given():
    model, where = summary(), target(8)
    old = EstimateSettings(seq_len=512, stack=RuntimeStack(torch_version="1.10", cuda_version="11.3"))
    new = EstimateSettings(seq_len=512, stack=NEW_STACK)
    a = estimate(model, where, Candidate(Rung.Z2, 1), old).gpu_components["cuda_context"]
    b = estimate(model, where, Candidate(Rung.Z2, 1), new).gpu_components["cuda_context"]
    assert (a, b) == (CONTEXT_EAGER, CONTEXT_LAZY)


# --- what transformers runs: attention kernel and loss path ----------------------------------------------

BLOOM = summary(
    name="hand-bloom",
    architecture="BloomForCausalLM",
    model_type="bloom",
    vocab_size=250880,
    config={"model_type": "bloom", "hidden_dropout": 0.0, "attention_dropout": 0.0},
)


def test_bloom_runs_eager_attention_with_an_fp32_softmax_whatever_is_asked():
    def layer(seq_len, attention="sdpa"):
        return layer_bytes(BLOOM, EstimateSettings(seq_len=seq_len, precision="fp16", attention=attention))

    assert layer(512) == layer(512, "eager")
    # layer(s) = a*s + b*s^2 with b = heads x (4 B fp32 probabilities + their 2 B fp16 copy)
    quadratic = (layer(1024) - 2 * layer(512)) // (1024**2 - 2 * 512**2)
    assert quadratic == BLOOM.num_heads * (4 + 2)


def test_causal_loss_path_follows_the_transformers_version():
    def per_token(model, version):
        stack = RuntimeStack(transformers_version=version)
        settings = EstimateSettings(seq_len=1024, precision="fp16", stack=stack)
        return logits_bytes_per_sample(model, settings) // (model.vocab_size * 1024)

    llama = replace(BLOOM, model_type="llama", architecture="LlamaForCausalLM")
    assert per_token(BLOOM, "4.29.0") == 6  # CrossEntropyLoss on the 16-bit shifted logits
    assert per_token(BLOOM, "4.46.1") == 12  # loss_utils.ForCausalLMLoss upcasts to fp32
    assert per_token(BLOOM, None) == 12  # unknown: the larger, current path
    assert per_token(llama, "4.37.2") == 12  # Llama's forward upcast before 4.46


# --- the margin ------------------------------------------------------------------------------------------


def test_gpu_fits_needs_the_margin_cpu_does_not():
    model, where = summary(), target(8)
    gpu = estimate(model, where, Candidate(Rung.Z2, 2), EstimateSettings(seq_len=1024))
    assert {"model_states", "activations", "cuda_context", "nccl_buffers", "allocator_slack"} <= set(
        gpu.gpu_uncertainty
    )
    between = replace(where, free_memory_bytes=gpu.gpu_peak_bytes + gpu.gpu_margin_bytes // 2)
    assert not check_fit(gpu, between, 1.0).fits
    assert check_fit(gpu, replace(where, free_memory_bytes=gpu.gpu_peak_bytes + gpu.gpu_margin_bytes), 1.0).fits
    cpu = estimate(model, where, Candidate(Rung.Z2, 2), EstimateSettings(seq_len=1024, device="cpu"))
    assert cpu.gpu_uncertainty == {}


def test_a_measured_trial_shrinks_the_margin():
    model, where, settings = summary(), target(8), EstimateSettings(seq_len=1024)
    candidate = Candidate(Rung.Z2, 2)
    cold = estimate(model, where, candidate, settings)
    learned = calibrate(
        Calibration(), model, where, candidate, settings=settings, measured_peak_bytes=cold.gpu_peak_bytes
    )
    warm = estimate(model, where, candidate, settings, calibration=learned)
    assert "cuda_context" not in warm.gpu_uncertainty and warm.gpu_margin_bytes < cold.gpu_margin_bytes


# --- OOM trials teach the model --------------------------------------------------------------------------------


def test_an_oom_without_successes_lifts_the_prediction_above_the_limit():
    model, where, settings = summary(), target(8), EstimateSettings(seq_len=1024)
    candidate = Candidate(Rung.Z2, 8)
    predicted = estimate(model, where, candidate, settings).gpu_peak_bytes
    limit = predicted + 2 * GiB  # the model thought it fitted; the run said otherwise
    learned = calibrate_oom(Calibration(), model, where, candidate, settings=settings, limit_bytes=limit)
    assert estimate(model, where, candidate, settings, calibration=learned).gpu_peak_bytes > limit
    assert learned.oom_bounds and learned.oom_bounds[0]["key"] == candidate.key


def test_an_oom_above_a_success_steepens_the_line_and_moves_the_next_guess():
    model, settings = summary(), EstimateSettings(seq_len=1024)
    where = target(8, memory=40 * GiB)
    ran, failed = Candidate(Rung.Z2, 2), Candidate(Rung.Z2, 16)
    measured = estimate(model, where, ran, settings).gpu_peak_bytes
    calibration = calibrate(Calibration(), model, where, ran, settings=settings, measured_peak_bytes=measured)
    before = largest_micro_batch(
        model, where, Rung.Z2, False, settings=settings, headroom=1.0, calibration=calibration, limit=64
    )
    assert before is not None and before >= 16  # the model believed 16 fits
    limit = where.free_memory_bytes
    calibration = calibrate_oom(calibration, model, where, failed, settings=settings, limit_bytes=limit)
    assert calibration.activation_scale(False) > 1 and set(calibration.activation_scales) == {"nockpt"}
    assert estimate(model, where, failed, settings, calibration=calibration).gpu_peak_bytes > limit
    assert estimate(model, where, ran, settings, calibration=calibration).gpu_peak_bytes == pytest.approx(
        measured, rel=1e-6
    )
    after = largest_micro_batch(
        model, where, Rung.Z2, False, settings=settings, headroom=1.0, calibration=calibration, limit=64
    )
    assert after is not None and 2 <= after < 16
    # a later success at a larger micro-batch keeps the bound in force
    again = calibrate(
        calibration, model, where, Candidate(Rung.Z2, 4), settings=settings, measured_peak_bytes=measured + GiB
    )
    assert estimate(model, where, failed, settings, calibration=again).gpu_peak_bytes > limit


# --- the published set ---------------------------------------------------------------------------------------


def _published_module():
    spec = importlib.util.spec_from_file_location("published_accuracy", REPO / "benchmarks" / "published_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules.setdefault("published_accuracy", module)  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


# Held-out points the frozen model (commit 80def53) says "fits" although the run ran out of memory. Kept in the
# set and listed here so the failure stays visible; the test fails if one is fixed (remove it then) or a new one
# appears. dszero-dsmath7b-case5-z2-offload-gc left it with DeepSpeed's offload gradient check
# (estimate/buffers.py offload_gradient_check_bytes, tests/test_estimate_offload_check.py).
KNOWN_FALSE_FITS: dict[str, str] = {}


def test_published_points_quote_a_source_and_list_assumptions():
    module = _published_module()
    points = json.loads((REPO / "benchmarks" / "published" / "points.json").read_text())["points"]
    assert len(points) >= 30
    assert sum(point.get("held_out", False) for point in points) >= 10
    for point in points:
        assert point["source"].startswith("https://") and point["quote"]
        kind = point["measurement"]["kind"]
        assert kind in module.MEASUREMENT_KINDS
        assert kind not in module.FIGURE_KINDS or point["measurement"]["value_gib"] > 0
        assert isinstance(point["assumed"], list) and isinstance(point["stated"], list)
        assert set(point["unspecified"]) <= set(module.FULLY_SPECIFIED_SETTINGS)


def test_fully_specified_rule_reads_the_unspecified_list():
    module = _published_module()
    assert module.is_fully_specified({"id": "a", "unspecified": []})
    assert not module.is_fully_specified({"id": "b", "unspecified": ["seq_len"]})
    assert not module.is_fully_specified({"id": "c"})  # unclassified points never count as fully specified
    with pytest.raises(ValueError, match="unknown setting"):
        module.is_fully_specified({"id": "d", "unspecified": ["vibes"]})


@pytest.mark.slow
def test_no_false_fits_on_the_published_set():
    module = _published_module()
    points = json.loads(module.POINTS.read_text())["points"]
    outcomes = [module.run_point(point) for point in points]
    false_fits = sorted(o.point_id for o in outcomes if o.fits and not o.truth_fits)
    assert false_fits == sorted(KNOWN_FALSE_FITS)  # known failures, see KNOWN_FALSE_FITS for why
    assert not [o for o in outcomes if o.point_id in KNOWN_FALSE_FITS and not o.held_out]  # in-sample: none
    assert sum(o.fits for o in outcomes if o.truth_fits) >= 12  # the margin does not refuse everything
