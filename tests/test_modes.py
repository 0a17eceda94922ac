"""The modern memory modes: where each applies, the config autotune emits for it, and its memory terms."""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import pairwise
from types import SimpleNamespace

import pytest
from tests.fakes.models import summary as hand_summary

from autotune.core.ladder import LADDER, Candidate, Mode, Rung
from autotune.core.units import GiB
from autotune.core.versions import ZENFLOW, installed
from autotune.dsconfig.build_config import TrainSettings, build_ds_config, validate_with_deepspeed
from autotune.estimate import EstimateSettings, estimate
from autotune.estimate.mode_terms import mode_memory, partial_offload_device_elements, partial_offload_device_share
from autotune.hardware.specs import Target, generic_gpu
from autotune.models import ModelSummary
from autotune.modes.applies import (
    CPU_BACKEND,
    FAMILIES,
    RATIO_STEPS,
    SUPER_OFFLOAD,
    ModeFacts,
    applicable_modes,
    considered_modes,
    deepspeed_ratio,
    device_sub_groups,
    facts_for,
    is_superchip,
    mode_applies,
    mode_from_zero_section,
    mode_trial_verifiable,
    offloaded_fraction,
    ratio_grid,
    ratio_mode,
    ratio_sub_group_size,
)

# Where each mode applies at all, so with the opt-in (--allow-approximate) for the modes that change the training;
# that they stay out of the default search is tests/test_same_training.py's question.
ONE_GPU = ModeFacts(allow_approximate=True)
TWO_NODES = ModeFacts(nodes=2, gpus_per_node=8, allow_approximate=True)
GH200 = ModeFacts(superchip=True, allow_approximate=True)
CPU = ModeFacts(device="cpu", allow_approximate=True)


# tests/test_estimate.py's hand-built GPT-2-like summary, scaled to 1B parameters
_ONE_BILLION = dict(
    total_params=1_000_000_000,
    trainable_params=1_000_000_000,
    largest_layer_params=50_000_000,
    embedding_params=50_000_000,
    hidden_size=2048,
    num_layers=16,
    head_dim=128,
    intermediate_size=8192,
    config={"model_type": "gpt2", "activation_function": "gelu"},
)


def summary(**overrides) -> ModelSummary:
    return hand_summary(**{**_ONE_BILLION, **overrides})


def target(gpus: int = 1, nodes: int = 1, memory: int = 24 * GiB) -> Target:
    return Target(generic_gpu(memory), gpus_per_node=gpus, nodes=nodes, free_memory_bytes=memory)


def applying(rung: Rung, facts: ModeFacts) -> list[Mode]:
    return applicable_modes(rung, facts)


# --- applicability -------------------------------------------------------------------------------------------------


def test_partial_offload_applies_only_between_zero3_and_zero3_offload() -> None:
    for rung in LADDER:
        modes = [m for m in applying(rung, ONE_GPU) if m.offload_ratio != 1.0]
        assert bool(modes) == (rung is Rung.Z3_OFFLOAD_OPT), rung
    nvme = next(o for o in considered_modes(Rung.Z3_NVME_OPT, ONE_GPU) if o.family == "partial_offload")
    assert not nvme.applies and "NVMe" in nvme.reason and "stage3.py" in nvme.reason


def test_partial_offload_and_zenflow_need_deepspeeds_own_optimizer() -> None:
    client = ModeFacts(ds_optimizer=False, allow_approximate=True)
    assert not [m for m in applying(Rung.Z3_OFFLOAD_OPT, client) if m.offload_ratio != 1.0]
    assert Mode(zenflow=True) not in applying(Rung.Z2_OFFLOAD_OPT, client)
    reasons = {o.family: o.reason for o in considered_modes(Rung.Z3_OFFLOAD_OPT, client)}
    assert "DeepSpeedCPUAdam" in reasons["partial_offload"]


def test_zenflow_applies_to_stage2_offload_only() -> None:
    for rung in LADDER:
        assert (Mode(zenflow=True) in applying(rung, ONE_GPU)) == (rung is Rung.Z2_OFFLOAD_OPT), rung


def test_zero_plus_plus_applies_across_nodes_only() -> None:
    assert not [m for m in applying(Rung.Z3, ONE_GPU) if m.hpz_partition_size > 1 or m.quantized_weights]
    eight = ModeFacts(gpus_per_node=8, allow_approximate=True)
    assert not [m for m in applying(Rung.Z3, eight) if m.hpz_partition_size > 1]
    across = applying(Rung.Z3, TWO_NODES)
    assert Mode(hpz_partition_size=8) in across
    assert Mode(hpz_partition_size=8, quantized_weights=True, quantized_gradients=True) in across
    assert not [m for m in applying(Rung.Z2, TWO_NODES) if m.hpz_partition_size > 1]
    one_node = next(o for o in considered_modes(Rung.Z3, ONE_GPU) if o.family == "hpz")
    assert "node" in one_node.reason


def test_super_offload_applies_on_superchips_and_is_not_cpu_verifiable() -> None:
    assert Mode(super_offload=True) not in applying(Rung.Z3_OFFLOAD_OPT, ONE_GPU)
    assert Mode(super_offload=True) in applying(Rung.Z3_OFFLOAD_OPT, GH200)
    on_cpu = ModeFacts(device="cpu", superchip=True)
    option = next(o for o in considered_modes(Rung.Z3_OFFLOAD_OPT, on_cpu) if o.family == SUPER_OFFLOAD)
    assert option.applies and not option.trial_verifiable
    assert option.trial_verifiable == CPU_BACKEND[SUPER_OFFLOAD].runs


def test_every_rung_reports_every_family_with_a_reason() -> None:
    for facts in (ONE_GPU, TWO_NODES, GH200, CPU):
        for rung in LADDER:
            options = considered_modes(rung, facts)
            assert {o.family for o in options} <= set(FAMILIES)
            assert {"partial_offload", "zenflow", "hpz", "super_offload"} <= {o.family for o in options}
            for option in options:
                assert option.reason
                assert not option.trial_verifiable or option.applies
                assert option.to_dict()["label"] == option.mode.label
                assert mode_applies(rung, option.mode, facts) == option.applies, (rung, option)


def test_trial_verifiable_follows_the_measured_cpu_table() -> None:
    for option in considered_modes(Rung.Z3_OFFLOAD_OPT, CPU):
        if option.applies:
            assert option.trial_verifiable == mode_trial_verifiable(option.mode, CPU)
    assert mode_trial_verifiable(Mode(super_offload=True), ONE_GPU)
    assert mode_trial_verifiable(Mode(super_offload=True), CPU) is CPU_BACKEND[SUPER_OFFLOAD].runs


# --- the ratio and DeepSpeed's sub-groups ---------------------------------------------------------------------------


def test_ratio_mode_rounds_to_the_grid_and_refuses_nonsense() -> None:
    assert ratio_mode(0.26).offload_ratio == pytest.approx(0.25)
    assert ratio_mode(1.0).is_classic
    assert ratio_grid()[0] == 0.0 and ratio_grid()[-1] == 1.0 and len(ratio_grid()) == RATIO_STEPS + 1
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            ratio_mode(bad)


def test_one_sub_group_makes_any_ratio_offload_everything() -> None:
    """DeepSpeed's default sub_group_size (1e9) on a smaller model: int((1 - r) * 1) == 0 for every r > 0."""
    for ratio in (0.05, 0.5, 0.95):
        assert offloaded_fraction(ratio, sub_groups=1) == 1.0
    assert offloaded_fraction(0.0, sub_groups=1) == 0.0
    assert offloaded_fraction(0.5, sub_groups=RATIO_STEPS) == pytest.approx(0.5)
    for ratio in ratio_grid():
        assert offloaded_fraction(ratio) >= ratio - 1e-9  # the device share rounds down


# GPT-2 (124M) parameters in registration order: wte, wpe, 12 blocks (ln_1, attn c_attn/c_proj, ln_2, mlp), ln_f
_GPT2_BLOCK = [768, 768, 768 * 2304, 2304, 768 * 768, 768, 768, 768, 768 * 3072, 3072, 3072 * 768, 768]
GPT2_SIZES = [50257 * 768, 1024 * 768] + _GPT2_BLOCK * 12 + [768, 768]


def _fake_params(sizes: list[int], world: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(partition_numel=lambda n=n: math.ceil(n / world)) for n in sizes]


@pytest.mark.parametrize("world", [1, 8])
def test_emitted_sub_group_size_cuts_deepspeeds_sub_groups_as_the_ratio_needs(world: int) -> None:
    """DeepSpeed's own sub-group cut (stage3.py:1210-1233) on a GPT-2-sized parameter list, with our size."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    sizes = GPT2_SIZES
    size = ratio_sub_group_size(sum(sizes), world)
    cut = DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups(
        SimpleNamespace(sub_group_size=size), _fake_params(sizes, world)
    )
    per_group = [sum(p.partition_numel() for p in group) for group in cut]
    total = sum(per_group)
    assert RATIO_STEPS // 2 <= len(cut) <= RATIO_STEPS
    for ratio in (0.25, 0.5, 0.75):
        on_device = int((1 - ratio) * len(cut))  # stage3.py:1105
        device_share = sum(per_group[:on_device]) / total
        # the embedding (39M of 124M) is the first sub-group: the share moves in whole parameters
        assert abs(device_share - (1 - ratio)) < max(per_group) / total + 1e-9
    default = DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups(
        SimpleNamespace(sub_group_size=1_000_000_000), _fake_params(sizes, world)
    )
    assert len(default) == 1


# --- emitted configs ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("facts", [ONE_GPU, TWO_NODES, GH200], ids=["one-gpu", "two-nodes", "gh200"])
def test_every_applicable_mode_passes_deepspeeds_parser_at_the_world_size(facts: ModeFacts) -> None:
    facts = replace(facts, deepspeed_version=installed("deepspeed"))  # a mode it predates is not applicable
    settings = TrainSettings(world_size=facts.world_size, hidden_size=2048, trainable_params=1_000_000_000)
    checked = 0
    for rung in LADDER:
        for mode in applying(rung, facts):
            config = build_ds_config(Candidate(rung, 2, False, mode), settings)
            validate_with_deepspeed(config, facts.world_size)
            zero = config["zero_optimization"]
            if mode.offload_ratio != 1.0:
                assert zero["offload_optimizer"]["ratio"] == mode.offload_ratio
                assert zero["sub_group_size"] == ratio_sub_group_size(1_000_000_000, facts.world_size)
            if mode.zenflow:
                assert zero["zenflow"]["topk_ratio"] == 0.1
            if mode.hpz_partition_size > 1:
                assert zero["zero_hpz_partition_size"] == facts.gpus_per_node
            assert zero.get("zero_quantized_weights", False) == mode.quantized_weights
            assert zero.get("zero_quantized_gradients", False) == mode.quantized_gradients
            if mode.super_offload:
                assert zero["offload_optimizer"]["super_offload"] is True
                assert zero["offload_optimizer"]["cpuadam_cores_perc"] == 0.8
            checked += 1
    # the partial offload ratio everywhere; ZenFlow (and more) only where the installed release runs it: at the
    # declared floor (0.17.6) a single GPU has the ratio alone (versions.ZENFLOW, SUPER_OFFLOAD)
    assert checked >= (2 if ZENFLOW.missing(facts.deepspeed_version) is None else 1)


def test_every_ratio_on_the_grid_parses() -> None:
    settings = TrainSettings(world_size=4, trainable_params=7_000_000_000)
    for ratio in ratio_grid():
        config = build_ds_config(Candidate(Rung.Z3_OFFLOAD_OPT, 1, False, ratio_mode(ratio)), settings)
        validate_with_deepspeed(config, 4)


def test_a_mode_on_a_rung_without_it_is_refused_not_dropped() -> None:
    settings = TrainSettings(world_size=2, trainable_params=1_000_000)
    for rung, mode in (
        (Rung.Z3, Mode(offload_ratio=0.5)),
        (Rung.Z3_OFFLOAD_OPT, Mode(zenflow=True)),
        (Rung.Z2, Mode(hpz_partition_size=2)),
        (Rung.Z3, Mode(super_offload=True)),
        (Rung.Z3, Mode(hpz_partition_size=4)),  # does not divide the world size
    ):
        with pytest.raises(ValueError):
            build_ds_config(Candidate(rung, 1, False, mode), settings)
    with pytest.raises(ValueError, match="trainable_params"):
        build_ds_config(Candidate(Rung.Z3_OFFLOAD_OPT, 1, False, Mode(offload_ratio=0.5)), TrainSettings(world_size=1))


def test_classic_configs_are_unchanged_by_modes() -> None:
    settings = TrainSettings(world_size=2, hidden_size=64)
    for rung in LADDER:
        zero = build_ds_config(Candidate(rung, 1), settings)["zero_optimization"]
        assert "sub_group_size" not in zero and "zenflow" not in zero and "zero_hpz_partition_size" not in zero
        assert "ratio" not in zero.get("offload_optimizer", {})


# --- memory model ---------------------------------------------------------------------------------------------------


def _peak(rung: Rung, mode: Mode = Mode(), tgt: Target | None = None, device: str = "cuda") -> tuple[int, int]:
    settings = EstimateSettings(seq_len=1024, device=device)
    result = estimate(summary(), tgt or target(), Candidate(rung, 1, True, mode), settings)
    return result.gpu_peak_bytes, result.host_ram_bytes


def test_gpu_estimate_falls_as_the_ratio_rises_and_meets_both_neighbours() -> None:
    peaks = [_peak(Rung.Z3_OFFLOAD_OPT, ratio_mode(r)) for r in ratio_grid()]
    gpu = [p[0] for p in peaks]
    host = [p[1] for p in peaks]
    assert all(a >= b for a, b in pairwise(gpu)), gpu
    # host RAM rises with the ratio while the sub-group cut stays the same (dsconfig's, below 1.0); the classic
    # rung at 1.0 runs DeepSpeed's default single sub-group, whose one pinned gradient buffer can round to less
    # than the cut's many (estimate/pinned.py)
    assert all(a <= b for a, b in pairwise(host[:-1])), host
    assert gpu[0] > gpu[-1] and host[0] < host[-1]
    assert gpu[-1] == _peak(Rung.Z3_OFFLOAD_OPT)[0]  # ratio 1.0 is the classic offload rung
    zero3 = _peak(Rung.Z3)[0]
    # ratio 0: the classic ZeRO-3 states, plus the fp32 gradients DeepSpeed keeps resident per device sub-group
    # (stage3.py:1337-1342) where plain ZeRO-3 builds them per sub-group in the step, and torch AdamW's temporaries
    assert zero3 <= gpu[0] <= zero3 + 4 * 1_000_000_000 + 2 * GiB


def test_monotone_on_several_layouts_and_on_the_cpu_backend() -> None:
    for tgt in (target(gpus=8), target(gpus=8, nodes=4)):
        gpu = [_peak(Rung.Z3_OFFLOAD_OPT, ratio_mode(r), tgt)[0] for r in ratio_grid()]
        assert all(a >= b for a, b in pairwise(gpu))
    # the CPU backend: "GPU" and host are one process; moving states between them changes the sum only by the
    # device-side optimizer's step temporaries
    cpu = [_peak(Rung.Z3_OFFLOAD_OPT, ratio_mode(r), device="cpu")[0] for r in ratio_grid()]
    assert max(cpu) - min(cpu) <= 4 * math.ceil(1_000_000_000 / RATIO_STEPS) + 1


def test_partial_offload_terms_follow_deepspeeds_sub_group_cut() -> None:
    model = summary()
    candidate = Candidate(Rung.Z3_OFFLOAD_OPT, 1, False, Mode(offload_ratio=0.3))
    terms = mode_memory(model, target(gpus=4), candidate, "bf16")
    on_device = partial_offload_device_elements(0.3, 250_000_000, 50_000_000 // 4, 2048 * 8192 // 4)
    assert terms.device_components["partial_offload_states"] == 16 * on_device
    host = terms.host_components
    saved = host["partial_offload_host_saving"] + host["partial_offload_pageable_saving"]
    assert saved == -terms.device_components["partial_offload_states"]
    assert mode_memory(model, target(), Candidate(Rung.Z3_OFFLOAD_OPT, 1), "bf16").device_bytes == 0
    assert partial_offload_device_share(0.3) == pytest.approx(int(0.7 * RATIO_STEPS) / RATIO_STEPS)


@pytest.mark.parametrize("world", [1, 2, 8])
def test_device_elements_match_deepspeeds_own_cut_on_gpt2(world: int) -> None:
    """The model's device share against DeepSpeed's real sub-group cut (stage3.py:1210-1233, 1105) on GPT-2."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    sizes = GPT2_SIZES
    per_rank_sizes = [math.ceil(n / world) for n in sizes]
    size = ratio_sub_group_size(sum(sizes), world)
    cut = DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups(
        SimpleNamespace(sub_group_size=size), _fake_params(sizes, world)
    )
    per_group = [sum(p.partition_numel() for p in group) for group in cut]
    for ratio in ratio_grid():
        written = deepspeed_ratio(ratio)  # what dsconfig writes, and what DeepSpeed's expression then reads
        deepspeed_device = sum(per_group[: int((1 - written) * len(cut))])
        per_rank, mlp = math.ceil(sum(sizes) / world), math.ceil(768 * 3072 / world)
        modelled = partial_offload_device_elements(ratio, per_rank, per_rank_sizes[0], mlp)
        # never under DeepSpeed's cut by more than rounding, at most about two sub-groups over (conservative)
        error = (modelled - deepspeed_device) / sum(per_rank_sizes)
        assert -0.005 <= error <= 2.5 / RATIO_STEPS, (ratio, modelled, deepspeed_device)


def test_hpz_zenflow_and_quantization_terms() -> None:
    model = summary()
    eight_by_two = target(gpus=8, nodes=2)
    hpz = mode_memory(model, eight_by_two, Candidate(Rung.Z3, 1, False, Mode(hpz_partition_size=8)), "bf16")
    assert hpz.device_components == {"hpz_secondary_params": 2 * 1_000_000_000 // 8}
    offloaded = Candidate(Rung.Z3_OFFLOAD_ALL, 1, False, Mode(hpz_partition_size=8))
    assert mode_memory(model, eight_by_two, offloaded, "bf16").device_bytes == 0  # the copy lives on the host
    zenflow = mode_memory(model, target(), Candidate(Rung.Z2_OFFLOAD_OPT, 1, False, Mode(zenflow=True)), "bf16")
    assert zenflow.device_components["zenflow_selected_states"] == round(3 * 2 * 0.1 * 1_000_000_000)
    both = Mode(quantized_weights=True, quantized_gradients=True)
    quantized = mode_memory(model, eight_by_two, Candidate(Rung.Z3, 1, False, both), "bf16")
    assert set(quantized.device_components) == {"qwz_buffers", "qgz_buffers"}
    full = _peak(Rung.Z3, Mode(hpz_partition_size=8), eight_by_two)[0]
    assert full - _peak(Rung.Z3, tgt=eight_by_two)[0] >= hpz.device_bytes


def test_mode_terms_carry_a_margin() -> None:
    candidate = Candidate(Rung.Z3_OFFLOAD_OPT, 1, True, Mode(offload_ratio=0.5))
    result = estimate(summary(), target(), candidate, EstimateSettings(seq_len=1024))
    assert result.gpu_components["partial_offload_states"] > 0
    assert result.gpu_uncertainty["partial_offload_states"] == pytest.approx(
        0.10 * result.gpu_components["partial_offload_states"], rel=0.01
    )
    assert replace(result.candidate, mode=Mode()).mode.is_classic


def test_facts_for_a_target_find_superchips_by_profile() -> None:
    from autotune.hardware.specs import resolve_gpu_type

    gh200 = Target(resolve_gpu_type("gh200"), gpus_per_node=4, nodes=2, free_memory_bytes=90 * GiB)
    facts = facts_for(gh200, "cuda")
    assert facts.superchip and facts.world_size == 8
    assert not facts_for(gh200, "cpu").superchip
    h100 = Target(resolve_gpu_type("h100-80gb"), gpus_per_node=8, free_memory_bytes=80 * GiB)
    assert not facts_for(h100, "cuda").superchip
    assert is_superchip("", "NVIDIA GH200 480GB")


def test_a_users_zero_section_reads_back_as_the_mode_that_wrote_it() -> None:
    settings = TrainSettings(world_size=16, trainable_params=1_000_000_000)
    for facts in (TWO_NODES, GH200):
        for rung in LADDER:
            for mode in applying(rung, facts):
                zero = build_ds_config(Candidate(rung, 1, False, mode), replace(settings, world_size=facts.world_size))
                assert mode_from_zero_section(zero["zero_optimization"]) == mode
    assert mode_from_zero_section({"stage": 3}).is_classic


@pytest.mark.parametrize("world", [1, 8])
def test_every_grid_ratio_means_what_it_says_under_deepspeeds_expression(world: int) -> None:
    """DeepSpeed keeps int((1 - r) * n) sub-groups on the device, in floating point (stage3.py:1105): written as
    is, 0.9 keeps one of 20 (as 0.95 does) and 0.8 three (as 0.85). On the config dsconfig emits, DeepSpeed's own
    cut (stage3.py:1210-1233) and its expression give floor((1 - r) x n) for every grid ratio, the count the memory
    model assumes, and all 19 ratios are distinct settings."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    params = 20 * 4096 * world  # equal parameters: DeepSpeed's cut is exactly RATIO_STEPS sub-groups
    sizes = [4096 * world] * 20
    settings = TrainSettings(world_size=world, trainable_params=params)
    device_counts = []
    for ratio in (r for r in ratio_grid() if 0 < r < 1):
        zero = build_ds_config(Candidate(Rung.Z3_OFFLOAD_OPT, 1, False, Mode(offload_ratio=ratio)), settings)
        section = zero["zero_optimization"]
        written = section["offload_optimizer"]["ratio"]
        cut = DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups(
            SimpleNamespace(sub_group_size=section["sub_group_size"]), _fake_params(sizes, world)
        )
        deepspeed_count = int((1 - written) * len(cut))  # stage3.py:1105, verbatim
        assert len(cut) == RATIO_STEPS
        assert deepspeed_count == round((1 - ratio) * RATIO_STEPS) == device_sub_groups(ratio, len(cut))
        per_rank, size = params // world, section["sub_group_size"]
        # the memory model: the first int((1 - r) * n) sub-groups, plus its one conservative sub-group
        modelled = partial_offload_device_elements(ratio, per_rank)
        assert modelled == (min(per_rank, (deepspeed_count + 1) * size) if deepspeed_count else 0)
        for n in range(1, 3 * RATIO_STEPS):  # any sub-group count: the exact floor, never the float's slip
            assert int((1 - written) * n) == math.floor(round((1 - ratio) * RATIO_STEPS) * n / RATIO_STEPS)
        device_counts.append(deepspeed_count)
    assert len(set(device_counts)) == len(device_counts) == RATIO_STEPS - 1
    assert int((1 - 0.9) * 20) == 1 and int((1 - deepspeed_ratio(0.9)) * 20) == 2  # the slip this fixes


def test_a_users_ratio_is_predicted_with_deepspeeds_truncation_as_written() -> None:
    """A user's 0.9 is what DeepSpeed reads: one sub-group of 20 on the device, not two."""
    assert device_sub_groups(0.9, 20, as_written=True) == 1
    assert device_sub_groups(0.9, 20) == 2
    size = 1_000
    assert partial_offload_device_elements(0.9, 20 * size, sub_group_size=size) == 2 * size  # 1 + the spare
