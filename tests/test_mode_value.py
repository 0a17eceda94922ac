"""The Mode value on a Candidate: classic candidates keep their old keys and dicts (cache entries stay valid)."""

from autotune.core.ladder import Candidate, Mode, Rung


def test_classic_candidate_key_and_dict_are_unchanged() -> None:
    candidate = Candidate(Rung.Z2_OFFLOAD_OPT, 4, True)
    assert candidate.mode.is_classic
    assert candidate.key == "z2+offload_opt/mb4/ckpt"
    assert candidate.to_dict() == {"rung": "z2+offload_opt", "micro_batch": 4, "grad_checkpointing": True}
    assert Candidate.from_dict(candidate.to_dict()) == candidate


def test_modern_mode_round_trips_and_names_itself() -> None:
    mode = Mode(offload_ratio=0.25, hpz_partition_size=8, quantized_weights=True)
    candidate = Candidate(Rung.Z3_OFFLOAD_OPT, 2, False, mode)
    assert candidate.key == "z3+offload_opt/mb2/nockpt/ratio0.25+hpz8+qw"
    assert "offload ratio 0.25" in candidate.describe() and "hpZ partition 8" in candidate.describe()
    assert Candidate.from_dict(candidate.to_dict()) == candidate
    assert candidate != Candidate(Rung.Z3_OFFLOAD_OPT, 2, False)
