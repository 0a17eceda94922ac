import pytest

from autotune.core.ladder import Candidate, Rung, parse_rung
from autotune.core.units import format_bytes, parse_bytes
from autotune.dsconfig.build_config import (
    ConfigRejected,
    TrainSettings,
    build_ds_config,
    gradient_accumulation,
    hf_variant,
    validate_with_deepspeed,
)
from autotune.errors import UserError


@pytest.mark.parametrize(
    ("text", "expected"),
    [("80GiB", 80 * 2**30), ("80 GB", 80 * 10**9), ("24g", 24 * 10**9), ("1.5e9", 1_500_000_000), ("512MiB", 2**29)],
)
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "80 parsecs", "-5GB", "0"])
def test_parse_bytes_rejects(text: str) -> None:
    with pytest.raises(UserError):
        parse_bytes(text)


def test_format_bytes() -> None:
    assert format_bytes(80 * 2**30) == "80.0 GiB"
    assert format_bytes(None) == "-"


def test_rung_properties() -> None:
    assert [r.stage for r in Rung] == [0, 1, 2, 2, 3, 3, 3, 3, 3]
    assert Rung.Z2_OFFLOAD_OPT.offload_optimizer == "cpu" and Rung.Z2_OFFLOAD_OPT.offload_param is None
    assert Rung.Z3_OFFLOAD_ALL.offload_param == "cpu"
    assert Rung.Z3_NVME_OPT.offload_optimizer == "nvme" and Rung.Z3_NVME_OPT.offload_param == "cpu"
    assert Rung.Z3_NVME_ALL.offload_param == "nvme"
    assert parse_rung("z3+offload_opt") is Rung.Z3_OFFLOAD_OPT
    assert Candidate.from_dict(Candidate(Rung.Z2, 4, True).to_dict()) == Candidate(Rung.Z2, 4, True)


def test_gradient_accumulation() -> None:
    assert gradient_accumulation(None, 4, 8) == 1
    assert gradient_accumulation(64, 4, 8) == 2
    assert gradient_accumulation(64, 3, 8) is None


@pytest.mark.parametrize("rung", list(Rung))
def test_every_rung_is_accepted_by_deepspeed_at_target_world_size(rung: Rung) -> None:
    config = build_ds_config(Candidate(rung, 4, False), TrainSettings(world_size=8, global_batch=64, hidden_size=1024))
    assert config["train_batch_size"] == 64 and config["gradient_accumulation_steps"] == 2
    assert config["zero_optimization"]["stage"] == rung.stage
    validate_with_deepspeed(config, world_size=8)


def test_validation_uses_the_target_world_size() -> None:
    config = build_ds_config(Candidate(Rung.Z2, 4, False), TrainSettings(world_size=8, global_batch=64))
    with pytest.raises(ConfigRejected, match="train_batch_size"):
        validate_with_deepspeed(config, world_size=4)


def test_global_batch_that_does_not_divide_is_refused() -> None:
    with pytest.raises(UserError, match="not a multiple"):
        build_ds_config(Candidate(Rung.Z0, 3, False), TrainSettings(world_size=2, global_batch=16))


def test_hf_variant_keeps_tuned_values_and_leaves_only_hyperparameters_to_trainer() -> None:
    config = build_ds_config(Candidate(Rung.Z3, 2, False), TrainSettings(world_size=2, hidden_size=512))
    hf = hf_variant(config)
    assert hf["train_micro_batch_size_per_gpu"] == 2 and hf["gradient_accumulation_steps"] == 1
    assert hf["bf16"]["enabled"] is True and hf["zero_optimization"] == config["zero_optimization"]
    assert hf["optimizer"]["params"]["lr"] == "auto" and hf["gradient_clipping"] == "auto"
    assert "scheduler" not in hf
    assert config["optimizer"]["params"] == {}  # the original is untouched, and names no hyperparameter
