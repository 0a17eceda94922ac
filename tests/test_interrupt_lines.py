"""Issue 46: Ctrl-C says one line like SIGTERM does, and neither promises a resume that cannot happen."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.fakes.launchers import CountingLauncher

from autotune.cli.tune import _on_terminated
from autotune.core.ladder import Rung
from autotune.hook.leader import BestVerified
from autotune.infra.terminate import INTERRUPTED_EXIT, TERMINATED_EXIT, Terminated, sigterm_raises
from autotune.trial.trial_types import TrialResult, TrialSpec
from autotune.tuner import TuneRequest, tune

REPO = Path(__file__).resolve().parents[1]


class SignalOnFirstTrial(CountingLauncher):
    """The first trial sends `signum` to this process, as a user's Ctrl-C or scancel would mid-trial."""

    def __init__(self, signum: int) -> None:
        super().__init__()
        self.signum = signum

    def run(self, spec: TrialSpec) -> TrialResult:
        if not self.specs:
            os.kill(os.getpid(), self.signum)
            time.sleep(5)
        return super().run(spec)


def test_sigint_raises_terminated_with_exit_130_and_restores_the_handler() -> None:
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(Terminated) as raised, sigterm_raises():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    assert raised.value.exit_code == INTERRUPTED_EXIT and raised.value.stopped_by == "interrupted by SIGINT (Ctrl-C)"
    assert signal.getsignal(signal.SIGINT) is before
    assert Terminated().exit_code == TERMINATED_EXIT and str(Terminated()) == "terminated by SIGTERM; nothing written"


@pytest.mark.parametrize(("cache_mode", "resumable"), [(0o700, True), (0o777, False)])
def test_a_stopped_tuning_says_whether_a_rerun_resumes(tmp_path: Path, cache_mode: int, resumable: bool) -> None:
    """A world-writable cache directory is not used (search/cache.py), so nothing a rerun could resume from."""
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(cache_mode)
    request = TuneRequest.of(
        model="tiny-gpt2", device="cpu", memory_budget="1GiB", seq_len=32, rungs=(Rung.Z0,),
        out=str(tmp_path / "ds.json"), cache_dir=str(cache),
    )  # fmt: skip
    with pytest.raises(Terminated) as raised, sigterm_raises():
        tune(request, launcher=SignalOnFirstTrial(signal.SIGINT))
    assert raised.value.resumable is resumable and raised.value.exit_code == INTERRUPTED_EXIT
    line = _on_terminated(request, BestVerified(), raised.value)
    said = "a rerun resumes" if resumable else "no usable results cache: a rerun measures again"
    assert line == f"interrupted by SIGINT (Ctrl-C) before any trial verified a config; nothing written ({said})"
    assert not (tmp_path / "ds.json").exists()


def test_ctrl_c_outside_a_tuning_prints_one_line(tmp_path: Path) -> None:
    """`plan` has no trials to stop: typer turned Ctrl-C into a silent exit 130; now it says so."""
    probe = (
        # Ctrl-C as at a terminal, also where this test runs in the background (which ignores SIGINT: POSIX)
        "import os, signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from autotune.cli import main\nimport autotune.tuning.recommend as plan\n"
        "def interrupted(*a, **k):\n    os.kill(os.getpid(), signal.SIGINT)\n    import time; time.sleep(5)\n"
        "plan.recommend = interrupted\nmain(sys.argv[1:])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, "plan", "--model", "gpt2", "--gpu-type", "t4"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == INTERRUPTED_EXIT and len(lines) == 1, done.stderr
    assert lines[0].startswith("autotune: error: interrupted by SIGINT (Ctrl-C)")
