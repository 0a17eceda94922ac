"""Encoder-decoder lengths reach every step: the trial's batch, the tuning record, and `check` of the output.

The memory model prices the encoder at --seq-len and the decoder at --decoder-seq-len
(estimate/activations.py `_encoder_decoder_breakdown`); a trial that trained both at one length would measure
another job than the one it is asked about.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.fakes.trials import GENEROUS_TIMEOUT_S, cpu_ops_built, marked_env  # noqa: F401 (fixture)

from autotune.cli import main
from autotune.core.ladder import Candidate, Rung
from autotune.dsconfig.build_config import TrainSettings, build_ds_config
from autotune.models import resolve_model
from autotune.request.context import TuneContext
from autotune.request.tune_request import TuneRequest
from autotune.trial import LocalLauncher, TrialSpec, run_trial
from autotune.trial.worker.train_steps import synthetic_batch


def test_the_trial_batch_gives_the_decoder_its_own_length() -> None:
    import torch

    from autotune.models.architecture import build_model

    source = resolve_model("tiny-t5")
    model, _ = build_model(source.config, source.architecture, "cpu")
    batch = synthetic_batch(model, "encoder-decoder", 2, 48, device=torch.device("cpu"), seed=0, decoder_seq_len=12)
    assert batch["input_ids"].shape == (2, 48)
    assert batch["labels"].shape == batch["decoder_input_ids"].shape == (2, 12)
    assert model(**batch).logits.shape[:2] == (2, 12)  # the decoder (and the logits) run at 12 tokens
    same = synthetic_batch(model, "encoder-decoder", 2, 48, device=torch.device("cpu"), seed=0)
    assert same["labels"].shape == (2, 48)  # no decoder length: both at seq_len, as before


def test_the_trial_spec_carries_the_requested_decoder_length() -> None:
    request = TuneRequest.of(model="t5-small", gpus=1, gpu_type="a100-80gb", seq_len=512, decoder_seq_len=128)
    ctx = TuneContext.build(request, outputs=False)
    spec = ctx.spec(Candidate(Rung.Z0, micro_batch=2))
    assert (spec.seq_len, spec.decoder_seq_len) == (512, 128)
    assert ctx.assumptions(None).decoder_seq_len == 128


def test_a_real_trial_trains_an_encoder_decoder_at_two_lengths() -> None:
    source = resolve_model("tiny-t5")
    settings = TrainSettings(world_size=1, precision="fp32", hidden_size=source.config["d_model"])
    spec = TrialSpec(
        model_config=source.config,
        architecture=source.architecture,
        family="encoder-decoder",
        ds_config=build_ds_config(Candidate(Rung.Z0, micro_batch=2), settings),
        seq_len=64,
        decoder_seq_len=16,
        device="cpu",
        warmup_steps=1,
        max_steps=3,
        timeout_s=GENEROUS_TIMEOUT_S,
    )
    _, env = marked_env()
    result = run_trial(spec, LocalLauncher(env=env))
    assert result.status == "ok", result.error
    assert result.samples_per_s and result.samples_per_s > 0


def test_check_of_a_tuned_config_asks_the_tuned_decoder_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`check` re-asks the tuning's question from ds_config.autotune.json, decoder length and optimizer included:
    the same config checked for a longer decoder predicts more."""
    out = tmp_path / "ds_config.json"
    args = ["--model", "t5-3b", "--gpus", "8", "--gpu-type", "a100-80gb", "--seq-len", "512"]
    with pytest.raises(SystemExit) as exited:
        main([*args, "--decoder-seq-len", "64", "--out", str(out)])
    assert exited.value.code == 0, capsys.readouterr().err
    record_path = tmp_path / "ds_config.autotune.json"
    record = json.loads(record_path.read_text())
    assert record["decoder_seq_len"] == 64 and record["optimizer"] == "adamw"

    def checked_peak() -> int:
        capsys.readouterr()
        with pytest.raises(SystemExit):
            main(["check", str(out), "--json"])
        return json.loads(capsys.readouterr().out)["fit"]["gpu_peak_bytes"]

    short = checked_peak()
    record_path.write_text(json.dumps({**record, "decoder_seq_len": 2048}))
    assert checked_peak() > short
