"""The user's config is the base (`tune --config base.json`): every key outside the tuned set is carried through
unchanged, "auto" included; its global batch, precision and optimizer are the job's; the trials train with it.
Without a base the emitted config names no hyperparameter the user did not give, or lists it as a placeholder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.fakes.launchers import CountingLauncher

from autotune.cli import main
from autotune.core.ladder import Rung
from autotune.dsconfig.base_config import TUNED_KEYS

BASE_TEXT = """{
  "train_batch_size": 16,
  "train_micro_batch_size_per_gpu": "auto",
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": 0.5,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-5, "weight_decay": 0.1, "betas": "auto", "eps": 1e-8}},
  "scheduler": {"type": "WarmupLR",
                "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-5, "warmup_num_steps": "auto"}},
  "zero_optimization": {"stage": 1},
  "activation_checkpointing": {"partition_activations": false, "number_checkpoints": null},
  "wall_clock_breakdown": true,
  "steps_per_print": 50,
  "data_types": {"grad_accum_dtype": "fp32"}
}
"""
NO_INVENTED = ("lr", "weight_decay", "gradient_clipping", "betas", "eps")


def _tune(tmp_path: Path, **options):
    from autotune.tuner import TuneRequest, tune

    request = TuneRequest.of(
        model="tiny-gpt2", device="cpu", memory_budget="2GiB", seq_len=64, gpus=1, max_trials=3,
        rungs=(Rung.Z2, Rung.Z2_OFFLOAD_OPT), out=str(tmp_path / "ds_config.json"), use_cache=False, **options,
    )  # fmt: skip
    trials = CountingLauncher(mib_per_sample=0, fixed_s=0.2, s_per_sample=0.0)  # every candidate alike
    return tune(request, launcher=trials), trials


def _keys_anywhere(value, found: set[str]) -> set[str]:
    if isinstance(value, dict):
        for key, inner in value.items():
            found.add(key)
            _keys_anywhere(inner, found)
    return found


def test_every_key_outside_the_tuned_set_is_kept_as_written(tmp_path: Path) -> None:
    base_path = tmp_path / "base.json"
    base_path.write_text(BASE_TEXT)
    base = json.loads(BASE_TEXT)
    result, trials = _tune(tmp_path, base_config=str(base_path))
    written_text = result.config_path.read_text()
    written = json.loads(written_text)
    kept = [key for key in base if key not in TUNED_KEYS]
    for key in kept:
        assert written[key] == base[key], key  # parsed values, "auto" included
        assert json.dumps(written[key]) == json.dumps(base[key]), key  # and their JSON text, key order included
    assert [k for k in written if k in base] == list(base)  # the base's order
    assert written["optimizer"]["params"]["betas"] == "auto" and written["scheduler"]["params"]["warmup_num_steps"]
    # the base's fixed global batch is kept and constrains micro-batch x accumulation x world
    micro, steps = written["train_micro_batch_size_per_gpu"], written["gradient_accumulation_steps"]
    assert written["train_batch_size"] == 16 == micro * steps * 1
    assert "bf16" not in written and "fp16" not in written  # the base trains in fp32: no precision invented
    hf = json.loads(result.hf_config_path.read_text())
    assert all(hf[key] == base[key] for key in kept)  # HF Trainer gets the user's keys as written too
    assert result.report.base_config == str(base_path)
    assert not [n for n in result.report.notes if n.startswith("placeholder")]
    # the trials trained with the same optimizer settings, the "auto" values filled as HF Trainer fills them
    assert trials.configs
    for config in trials.configs:
        assert config["optimizer"]["params"]["lr"] == 3e-5 and config["optimizer"]["params"]["weight_decay"] == 0.1
        assert config["gradient_clipping"] == 0.5 and config["scheduler"]["type"] == "WarmupLR"
        assert "auto" not in json.dumps(config)


def test_without_a_base_no_hyperparameter_is_invented(tmp_path: Path) -> None:
    result, trials = _tune(tmp_path)
    written = json.loads(result.config_path.read_text())
    assert not _keys_anywhere(written, set()) & set(NO_INVENTED), written
    assert written["optimizer"] == {"type": "AdamW", "params": {}}  # the type DeepSpeed builds the tuned optimizer by
    placeholders = [n for n in result.report.notes if n.startswith("placeholder")]
    assert len(placeholders) == 1 and "lr" in placeholders[0]
    for config in trials.configs:  # the trial trains with the very config written
        assert "gradient_clipping" not in config and config["optimizer"]["params"] == {}
    hf = json.loads(result.hf_config_path.read_text())  # HF Trainer: the user's TrainingArguments fill them
    assert hf["optimizer"]["params"]["lr"] == "auto" and hf["gradient_clipping"] == "auto"


def test_a_base_without_an_optimizer_gets_the_type_and_says_so(tmp_path: Path) -> None:
    base_path = tmp_path / "base.json"
    base_path.write_text(json.dumps({"gradient_clipping": 0.5, "bf16": {"enabled": "auto"}}))
    result, _ = _tune(tmp_path, base_config=str(base_path))
    written = json.loads(result.config_path.read_text())
    assert written["gradient_clipping"] == 0.5 and written["bf16"] == {"enabled": "auto"}
    assert written["optimizer"] == {"type": "AdamW", "params": {}}
    assert [n for n in result.report.notes if n.startswith("placeholder: optimizer")]
    hf = json.loads(result.hf_config_path.read_text())
    assert hf["optimizer"]["params"]["lr"] == "auto" and hf["gradient_clipping"] == 0.5
    # "auto" precision: the launch commands say the precision tuned for, not whatever "auto" reads as
    for name in ("bf16", "fp16"):
        assert (f"--{name}" in result.launch.hf_trainer.split()) == (result.report.precision == name)


@pytest.mark.parametrize(
    ("base", "args", "message"),
    [
        ({"train_batch_size": 16}, ["--global-batch", "32"], "--global-batch 32 differs from the base config's 16"),
        ({"bf16": {"enabled": True}}, ["--precision", "fp32"], "--precision fp32 differs"),
        (None, [], "config file not found"),
    ],
)
def test_a_base_that_contradicts_the_command_line_is_one_line(tmp_path: Path, capsys, base, args, message) -> None:
    path = tmp_path / "base.json"
    if base is not None:
        path.write_text(json.dumps(base))
    argv = ["tune", "--model", "tiny-gpt2", "--device", "cpu", "--config", str(path), "--out", str(tmp_path / "o.json")]
    with pytest.raises(SystemExit) as exited:
        main([*argv, *args])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_hook_takes_the_base_and_the_opt_in_as_tune_does(tmp_path: Path, monkeypatch, capsys) -> None:
    import autotune.hook

    seen = []

    def capture(request, **callbacks):
        seen.append(request.tuning)
        raise SystemExit(0)

    base_path = tmp_path / "base.json"
    base_path.write_text(BASE_TEXT)
    monkeypatch.setattr(autotune.hook, "run_hook", capture)
    options = ["hook", "--device", "cpu", "--model", "tiny-gpt2", "--cache-dir", str(tmp_path)]
    with pytest.raises(SystemExit):
        main([*options, "--config", str(base_path), "--allow-approximate"])
    (tuning,) = seen
    assert tuning.training.base_config == str(base_path) and tuning.search.allow_approximate
    with pytest.raises(SystemExit) as exited:  # an unreadable base: one line, before any coordination
        main([*options, "--config", str(tmp_path / "missing.json")])
    assert exited.value.code == 2 and len(seen) == 1
    assert "config file not found" in capsys.readouterr().err
