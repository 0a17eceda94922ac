"""A stopped tune writes every file a finished one writes: SIGTERM mid-search (scancel, a SLURM time limit) leaves
the config, its .hf.json, .accelerate.yaml and .autotune.json, and the report (markdown, JSON, picture) of the best
config verified so far, marked as stopped, so the HF user who cancels gets a file their launch line can use."""

from __future__ import annotations

import json

import pytest
from tests.fakes.launchers import CountingLauncher, SigtermLauncher

from autotune import tune
from autotune.core.ladder import Rung
from autotune.dsconfig.build_config import hf_variant
from autotune.infra.terminate import Terminated, sigterm_raises
from autotune.tuner import TuneRequest


def _request(directory, **overrides) -> TuneRequest:
    base = dict(
        model="tiny-gpt2",
        device="cpu",
        memory_budget="2GiB",
        seq_len=64,
        rungs=(Rung.Z0, Rung.Z1, Rung.Z3),
        micro_batches=(1, 2, 4),
        out=str(directory / "ds_config.json"),
        use_cache=False,
    )
    return TuneRequest.of(**{**base, **overrides})


def test_sigterm_mid_tune_writes_all_seven_files_marked_stopped(tmp_path) -> None:
    finished_dir, stopped_dir = tmp_path / "finished", tmp_path / "stopped"
    finished_dir.mkdir()
    stopped_dir.mkdir()
    tune(_request(finished_dir), launcher=CountingLauncher())
    finished = sorted(p.name for p in finished_dir.iterdir())
    assert len(finished) == 7, finished

    launcher = SigtermLauncher(after=1)
    with pytest.raises(Terminated) as stop, sigterm_raises():
        tune(_request(stopped_dir), launcher=launcher)
    assert len(launcher.specs) == 2  # one trial verified, the second interrupted
    assert sorted(p.name for p in stopped_dir.iterdir()) == finished
    message = str(stop.value)
    assert message.startswith("terminated by SIGTERM; wrote the best config verified so far")
    assert ".hf.json" in message and "autotune-report.md" in message
    report = json.loads((stopped_dir / "autotune-report.json").read_text())
    assert report["stop_reason"] == "terminated" and "SIGTERM" in report["stop_message"]
    assert "terminated by SIGTERM" in (stopped_dir / "autotune-report.md").read_text()
    config = json.loads((stopped_dir / "ds_config.json").read_text())
    assert config == launcher.specs[0].ds_config  # the one verified trial's
    hf = json.loads((stopped_dir / "ds_config.hf.json").read_text())
    assert hf == hf_variant(config, None)  # the HF variant a Trainer launch line takes


def test_sigterm_before_any_trial_verified_writes_nothing(tmp_path) -> None:
    launcher = SigtermLauncher(after=0)
    with pytest.raises(Terminated) as stop, sigterm_raises():
        tune(_request(tmp_path), launcher=launcher)
    assert str(stop.value) == "terminated by SIGTERM; nothing written"
    assert list(tmp_path.iterdir()) == []
