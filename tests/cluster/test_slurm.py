"""The cluster path under a real SLURM: munged, slurmctld and slurmd on this machine (tests/cluster/slurm_local.sh).

Run with `python3 -m pytest -q -m slurm tests/cluster` as root after
`apt-get update && apt-get install -y slurm-wlm munge`; skipped (with the reason) otherwise.
Everything runs on DeepSpeed's CPU backend with the tiny model; each job's output is kept under the
test's tmp dir, and benchmarks/results/slurm-cluster.log holds a committed run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "cluster" / "slurm_local.sh"
missing = [tool for tool in ("munged", "slurmctld", "slurmd", "sbatch") if shutil.which(tool) is None]
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        bool(missing), reason=f"SLURM not installed ({', '.join(missing)} missing): apt-get install -y slurm-wlm munge"
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="slurmd must run as root to start jobs"),
]
TINY_HOOK = "--micro-batches 1,2 --rungs z0 --max-trials 2 --wait-timeout 300"


def _free_port_pair(slurmds: int = 1) -> int:
    """A free port for slurmctld and the next `slurmds` for the slurmd(s)."""
    for _ in range(50):
        port = random.randint(20000, 40000)
        with contextlib.ExitStack() as stack:
            try:
                for candidate in range(port, port + 1 + slurmds):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port pair for slurmctld/slurmd")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A started cluster; the environment every sbatch/srun of these tests runs with."""
    yield from _started_cluster(tmp_path_factory, nodes=1)


@pytest.fixture(scope="module")
def two_node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Two nodes n1, n2 on this host (one slurmd each, slurm_local.sh SLURM_TEST_NODES=2)."""
    yield from _started_cluster(tmp_path_factory, nodes=2)


def _started_cluster(tmp_path_factory: pytest.TempPathFactory, nodes: int) -> Iterator[dict[str, str]]:
    state = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "SLURM_TEST_PORT": str(_free_port_pair(nodes)), "SLURM_TEST_CPUS": str(os.cpu_count() or 2)}
    env["SLURM_TEST_NODES"] = str(nodes)
    started = subprocess.run([str(SCRIPT), "start", str(state)], env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    env["SLURM_CONF"] = str(state / "slurm.conf")
    env.update(PYTHONPATH=str(REPO / "src"), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    # DeepSpeed's CPU ops are built once, outside any job's timing (tune() prebuilds them too, but a
    # launcher given to tune() skips that, as a tuner handed a launcher is expected to have them).
    build = [sys.executable, "-m", "autotune.trial.worker.ops_build", "--device", "cpu"]
    subprocess.run(build, env=env, check=True, timeout=900)
    try:
        yield env
    finally:
        subprocess.run([str(SCRIPT), "stop", str(state)], env=env, timeout=120)


def sbatch(env: dict[str, str], out: Path, script: Path | list, *options: str, wait: bool = True, **extra: str) -> str:
    """Submit `script` (or [script, args...]); with wait, return once the job ended. Returns the job id."""
    command = ["sbatch", "--parsable", f"--chdir={REPO}", f"--output={out}", *(["--wait"] if wait else []), *options]
    argv = [str(part) for part in (script if isinstance(script, list) else [script])]
    done = subprocess.run([*command, *argv], env={**env, **extra}, capture_output=True, text=True, timeout=900)
    assert done.stdout.strip(), done.stderr
    return done.stdout.strip().split(";")[0]


def job_state(env: dict[str, str], job_id: str) -> str:
    shown = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True)
    fields = dict(part.split("=", 1) for part in shown.stdout.split() if "=" in part)
    return fields.get("JobState", "GONE")


def wait_until_ended(env: dict[str, str], job_id: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while job_state(env, job_id) in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
        assert time.monotonic() < deadline, f"job {job_id} still {job_state(env, job_id)}"
        time.sleep(0.5)


def processes_of_job(job_id: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("SLURM_JOB_ID") == job_id and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


def hook_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("autotune hook: slurm job")]


# Each kind of training script with the flags its kind reads (examples/slurm/train-step.sh; docs/cluster.md).
_SCRIPTS = {
    "deepspeed": ("examples/training/train_deepspeed.py", "--model tiny-gpt2 --seq_len 32 --steps 2"),
    "hf": ("examples/training/train_hf.py", "--model tiny-gpt2 --seq_len 32 --max_steps 2 --use_cpu --report_to none"
           " --save_strategy no --output_dir hf-out"),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(_SCRIPTS))
def test_sbatch_example_tunes_once_every_task_gets_the_same_bytes_then_trains(
    cluster: dict[str, str], tmp_path: Path, kind: str
) -> None:
    out = tmp_path / "job.out"
    started = time.monotonic()
    script, train_args = _SCRIPTS[kind]
    job = sbatch(
        cluster, out, REPO / "examples" / "slurm" / "train.sbatch",
        "--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1",
        AUTOTUNE_DEVICE="cpu", MODEL="tiny-gpt2", SEQ_LEN="32", TRAIN_SCRIPT=script, SCRIPT_KIND=kind,
        AUTOTUNE_SHARED=str(tmp_path / "shared"), AUTOTUNE_HOOK_ARGS=TINY_HOOK, TRAIN_ARGS=train_args,
    )  # fmt: skip
    text = out.read_text()
    print(f"sbatch example: job {job} {time.monotonic() - started:.1f} s\n{text}")
    assert job_state(cluster, job) == "COMPLETED", text
    lines = hook_lines(text)
    assert len(lines) == 3, text  # two tasks, then the batch host's --print-env (a published result)
    assert sum("tuned here" in line for line in lines) == 1
    assert len({line.split("(sha256 ")[1].split(")")[0] for line in lines}) == 1
    engine = json.loads(next(line for line in text.splitlines() if line.startswith("ENGINE ")).removeprefix("ENGINE "))
    assert engine["world_size"] == 2 and engine["global_steps"] == 2
    config = json.loads(next((tmp_path / "shared" / "configs" / job).glob("ds_config.json")).read_text())
    assert config["train_batch_size"] == 2 * config["train_micro_batch_size_per_gpu"] * config.get(
        "gradient_accumulation_steps", 1
    )


SRUN_TUNING = """#!{python}
import sys
from pathlib import Path
from autotune import tune
from autotune.errors import UserError
from autotune.core.ladder import Rung
from autotune.trial import SlurmLauncher
from autotune.tuner import TuneRequest

out, cache, trials = sys.argv[1:4]
request = TuneRequest.of(model="tiny-gpt2", device="cpu", gpus=2, memory_budget="2GiB", seq_len=32,
                         micro_batches=(1, 2), rungs=(Rung.Z0,), max_trials=2, out=out, cache_dir=cache)
try:
    result = tune(request, launcher=SlurmLauncher(workdir=Path(trials)))
except UserError as error:
    print(f"autotune: error: {{error}}", file=sys.stderr)
    sys.exit(2)
print("verified", result.verified, "trials", result.trials_launched, "samples/s", result.samples_per_s)
"""


def test_a_tuning_whose_trials_are_srun_steps_of_two_tasks(cluster: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "tune.py"
    script.write_text(SRUN_TUNING.format(python=sys.executable))
    out = tmp_path / "job.out"
    args = [str(tmp_path / "ds.json"), str(tmp_path / "cache.sqlite"), str(tmp_path / "trials")]
    started = time.monotonic()
    job = sbatch(cluster, out, [script, *args], "--nodes=1", "--ntasks=2", "--cpus-per-task=1")
    text = out.read_text()
    print(f"srun trials: job {job} {time.monotonic() - started:.1f} s\n{text}")
    assert job_state(cluster, job) == "COMPLETED" and "verified True" in text, text
    trial_dirs = sorted((tmp_path / "trials").glob("trial-*"))
    assert trial_dirs, "SlurmLauncher keeps its trial directories (shared with the other nodes) until the next run"
    for trial in trial_dirs:  # both ranks of every trial ran as tasks of one srun step
        assert {"rank0.json", "rank1.json"} <= {p.name for p in trial.glob("rank*.json")}
    assert json.loads((tmp_path / "ds.json").read_text())["train_batch_size"] % 2 == 0
    assert processes_of_job(job) == []


def test_an_allocation_with_fewer_tasks_than_the_tuning_needs_is_one_clear_error(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    script = tmp_path / "tune.py"
    script.write_text(SRUN_TUNING.format(python=sys.executable))
    out = tmp_path / "srun.out"
    args = [str(tmp_path / "ds.json"), str(tmp_path / "cache.sqlite"), str(tmp_path / "trials")]
    job = sbatch(cluster, out, [script, *args], "--nodes=1", "--ntasks=1", "--cpus-per-task=1")
    errors = [line for line in out.read_text().splitlines() if line.startswith("autotune: error:")]
    assert job_state(cluster, job) == "FAILED" and len(errors) == 1, out.read_text()
    assert "srun cannot start the trial's 2 task(s)" in errors[0] and "--ntasks-per-node=2" in errors[0]
    # the hook: --gpus 2 (CPU ranks) in a job of one task per node
    hook = tmp_path / "hook.sh"
    hook.write_text(
        "#!/bin/bash\nsrun --overlap autotune hook --device cpu --model tiny-gpt2 --seq-len 32 --gpus 2"
        f" --cache-dir {tmp_path / 'shared'} --out {tmp_path / 'hook.json'}\n"
    )
    hook_out = tmp_path / "hook.out"
    job = sbatch(cluster, hook_out, hook, "--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=1")
    errors = [line for line in hook_out.read_text().splitlines() if line.startswith("autotune: error:")]
    assert len(errors) == 1 and "allocation has 1 task(s) per node" in errors[0], hook_out.read_text()
    assert not (tmp_path / "hook.json").exists()


def _trial_rows(cache: Path) -> int:
    if not cache.exists():
        return 0
    with contextlib.closing(sqlite3.connect(cache, timeout=30)) as db:
        try:
            return db.execute("SELECT count(*) FROM signed_trials").fetchone()[0]
        except sqlite3.OperationalError:
            return 0


def test_scancel_mid_tuning_then_resubmission_reuses_finished_trials(cluster: dict[str, str], tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    script = tmp_path / "hook.sh"
    script.write_text(
        "#!/bin/bash\nsrun --overlap autotune hook --device cpu --model tiny-gpt2 --seq-len 32 --memory-budget 2GiB"
        " --micro-batches 1,2,4,8 --rungs z0,z1,z2 --max-trials 6 --wait-timeout 120 --json"
        f" --cache-dir {shared} --out {tmp_path / 'ds.json'}\n"
    )
    first = sbatch(cluster, tmp_path / "first.out", script, "--ntasks=1", "--cpus-per-task=2", wait=False)
    deadline = time.monotonic() + 600
    while _trial_rows(shared / "results.sqlite") < 1:
        assert time.monotonic() < deadline and job_state(cluster, first) in ("PENDING", "RUNNING"), (
            (tmp_path / "first.out").read_text() if (tmp_path / "first.out").exists() else "no output"
        )
        time.sleep(0.5)
    cancelled = time.monotonic()
    subprocess.run(["scancel", first], env=cluster, check=True)
    wait_until_ended(cluster, first)
    ended = time.monotonic() - cancelled
    finished_before = _trial_rows(shared / "results.sqlite")
    first_out = (tmp_path / "first.out").read_text()
    print(f"scancel: job {first} ended {ended:.1f} s after scancel; {finished_before} trial(s) kept\n{first_out}")
    assert processes_of_job(first) == []  # nothing orphaned
    for lock in (shared / "hook").glob("*.lock"):  # no stale lock: the flock is free
        with open(lock) as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert list((shared / "hook" / "staging").iterdir()) == []

    started = time.monotonic()
    second = sbatch(cluster, tmp_path / "second.out", script, "--ntasks=1", "--cpus-per-task=2")
    elapsed = time.monotonic() - started
    second_out = (tmp_path / "second.out").read_text()
    print(f"resubmission: job {second} {elapsed:.1f} s\n{second_out}")
    assert job_state(cluster, second) == "COMPLETED", second_out
    result = json.loads(second_out[second_out.index("{") : second_out.rindex("}") + 1])
    assert result["role"] == "leader" and result["status"] == "complete" and result["verified"]
    report = json.loads(Path(result["report_path"]).with_suffix(".json").read_text())
    assert sum(1 for trial in report["trials"] if trial["from_cache"]) >= min(finished_before, 1)
    assert processes_of_job(second) == []


WARM_SRUN_POOL = """#!{python}
import json, sys
from pathlib import Path
from autotune.core.ladder import Candidate, Rung
from autotune.dsconfig.build_config import TrainSettings, build_ds_config
from autotune.models import resolve_model
from autotune.trial.launch.warm import WarmWorkerPool
from autotune.trial.launch.warm_nodes import SrunStart
from autotune.trial.trial_types import TrialSpec

source = resolve_model("tiny-gpt2")
spec = TrialSpec(
    model_config=source.config, architecture=source.architecture or "GPT2LMHeadModel", family="decoder-only",
    ds_config=build_ds_config(Candidate(Rung.Z2, 1), TrainSettings(world_size=2, precision="fp32")),
    seq_len=32, device="cpu", nprocs_per_node=2, nodes=1, max_steps=4, timeout_s=300,
)
with WarmWorkerPool(env={{"OMP_NUM_THREADS": "1", "SLURM_OVERLAP": "1"}}, workdir=Path(sys.argv[1]),
                    start=SrunStart(master_addr="127.0.0.1", master_port=int(sys.argv[2]))) as pool:
    results = [pool.run(spec) for _ in range(2)]
    print("RESULT", json.dumps({{"status": [r.status for r in results], "error": [r.error for r in results],
                               "ranks": [[m.rank for m in r.ranks] for r in results], "starts": pool.restarts}}))
"""


def test_warm_workers_in_one_background_srun_step_serve_trial_after_trial(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    """The multi-node pool's SLURM start (trial/launch/warm_nodes.py SrunStart) in a one-node allocation: one srun
    step of two tasks (ranks from SLURM_PROCID) serves two trials; nothing of the job is left once the pool closes.
    Several nodes need a cluster of several: this one-node cluster checks the step, not the crossing."""
    script = tmp_path / "pool.py"
    script.write_text(WARM_SRUN_POOL.format(python=sys.executable))
    out = tmp_path / "job.out"
    port = _free_port_pair()
    job = sbatch(cluster, out, [script, tmp_path / "pool", str(port)], "--nodes=1", "--ntasks=2", "--cpus-per-task=1")
    text = out.read_text()
    print(f"warm srun pool: job {job}\n{text}")
    assert job_state(cluster, job) == "COMPLETED", text
    found = json.loads(next(line for line in text.splitlines() if line.startswith("RESULT ")).removeprefix("RESULT "))
    assert found["status"] == ["ok", "ok"], found["error"]
    assert found["ranks"] == [[0, 1], [0, 1]] and found["starts"] == 1  # one step, two trials
    assert processes_of_job(job) == []


def test_the_hook_across_two_slurm_nodes_tunes_in_one_warm_srun_step_and_confirms_fresh(
    two_node_cluster: dict[str, str], tmp_path: Path
) -> None:
    """`srun autotune hook` on two nodes (n1, n2 of one host; MASTER_ADDR set, their names do not resolve): the
    leader's trials run in warm workers of one background srun step across both nodes, the pick's peak a fresh
    two-node step's (once more in a fresh srun step, or its own trial where that was the warm step's first:
    Pick.confirm_fresh); both tasks end with the same bytes."""
    shared = tmp_path / "shared"
    script = tmp_path / "hook.sh"
    script.write_text(
        "#!/bin/bash\nexport MASTER_ADDR=127.0.0.1\nsrun --overlap autotune hook --device cpu --model tiny-gpt2"
        " --seq-len 32 --memory-budget 2GiB --micro-batches 1,2 --rungs z0 --max-trials 3 --wait-timeout 900"
        f" --trial-timeout 600 --cache-dir {shared} --out {tmp_path / 'ds.json'}\n"
    )
    out = tmp_path / "job.out"
    started = time.monotonic()
    job = sbatch(two_node_cluster, out, script, "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1")
    text = out.read_text()
    print(f"hook on two slurm nodes: job {job} {time.monotonic() - started:.1f} s\n{text}")
    assert job_state(two_node_cluster, job) == "COMPLETED", text
    lines = hook_lines(text)
    assert len(lines) == 2 and sum("tuned here" in line for line in lines) == 1, text
    assert len({line.split("(sha256 ")[1].split(")")[0] for line in lines}) == 1  # the same bytes on both nodes
    report = json.loads(next(tmp_path.glob("*autotune-report.json")).read_text())
    choice = report["choice"]
    picked = {key: choice[key] for key in ("rung", "micro_batch", "grad_checkpointing")}
    fresh = [t for t in report["trials"] if t["candidate"] == picked and t["result"]["first_in_process"]]
    assert fresh and [r["rank"] for r in fresh[-1]["result"]["ranks"]] == [0, 1], report["trials"]
    assert fresh[-1]["result"]["status"] == "ok" and choice["peak_in_fresh_process"] is True
    confirmations = sum(t["purpose"] == "fresh-process confirmation" for t in report["trials"])
    assert confirmations == (fresh[-1]["purpose"] == "fresh-process confirmation")
    assert report["process_starts"] >= 1 + confirmations  # one warm step of both nodes (more after a replacement)
    pools = list((shared / "trials").glob("autotune-warm-*"))
    assert pools and all((pool / "launcher.log").exists() for pool in pools)  # the warm step's srun logged there
    assert processes_of_job(job) == []


# The tuners of the test below, each with one trial that hangs mid-step: a warm srun pool, and a fresh srun trial.
KILLED_TUNER_HEAD = (
    WARM_SRUN_POOL.split("with WarmWorkerPool")[0]
    + """
from autotune.trial.launch.heartbeat import HeartbeatTiming
from autotune.trial.launch.slurm import SlurmLauncher
from autotune.trial.worker.faults import FAULT_ENV, fault_value
env = {{"OMP_NUM_THREADS": "1", "SLURM_OVERLAP": "1", FAULT_ENV: fault_value("hang", "step")}}
beat = HeartbeatTiming(interval_s=0.5, stale_s=5.0)
"""
)
KILLED_TUNERS = {
    "warm": KILLED_TUNER_HEAD
    + """pool = WarmWorkerPool(env=env, workdir=Path(sys.argv[1]), heartbeat=beat,
                      start=SrunStart(master_addr="127.0.0.1", master_port=int(sys.argv[2])))
pool.run(spec)
""",
    "fresh": KILLED_TUNER_HEAD
    + """SlurmLauncher(env=env, workdir=Path(sys.argv[1]), heartbeat=beat, master_addr="127.0.0.1",
              master_port=int(sys.argv[2])).run(spec)
""",
}

# The job: start that tuner, SIGKILL it once both ranks run (srun, its child, is left running, as after a real
# SIGKILL), then watch the job's steps: the trial's step must end by itself once the heartbeat goes stale.
KILL_DRIVER = """#!{python}
import os, subprocess, sys, time
from pathlib import Path
pool, port, tuner_script = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
tuner = subprocess.Popen([sys.executable, tuner_script, str(pool), port])
deadline = time.monotonic() + 240
while len(list(pool.glob("*/rank*.pid"))) < 2:
    assert time.monotonic() < deadline, "the workers never started"
    time.sleep(0.5)
time.sleep(3)  # into the trial
def steps():
    job = os.environ["SLURM_JOB_ID"]
    out = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"], capture_output=True, text=True).stdout
    return [s for s in out.split() if not s.endswith((".batch", ".extern"))]
print("STEPS_BEFORE", len(steps()), flush=True)
tuner.kill(); tuner.wait(); killed = time.monotonic()
while steps() and time.monotonic() - killed < 120:
    time.sleep(0.5)
print("STEPS_AFTER", len(steps()), "SECONDS", round(time.monotonic() - killed, 1), flush=True)
"""


@pytest.mark.parametrize("workers", ["warm", "fresh"])
def test_a_sigkilled_tuners_srun_step_ends_by_itself(cluster: dict[str, str], tmp_path: Path, workers: str) -> None:
    """SIGKILL leaves the tuner's child srun and its step running: before the heartbeat, until the allocation ended
    (warm workers wait for the next trial; a hung fresh trial never ends). Now the step's workers see the tuner's
    heartbeat stand still (5 s here) and exit, and the step ends with them."""
    tuner, driver = tmp_path / "tuner.py", tmp_path / "driver.py"
    tuner.write_text(KILLED_TUNERS[workers].format(python=sys.executable))
    driver.write_text(KILL_DRIVER.format(python=sys.executable))
    out = tmp_path / "job.out"
    port = _free_port_pair()
    argv = [driver, tmp_path / "pool", str(port), tuner]
    job = sbatch(cluster, out, argv, "--nodes=1", "--ntasks=2", "--cpus-per-task=1")
    text = out.read_text()
    print(f"killed tuner ({workers}): job {job}\n{text}")
    assert "STEPS_BEFORE 1" in text, text
    after = next(line for line in text.splitlines() if line.startswith("STEPS_AFTER")).split()
    assert after[1] == "0" and 4.0 <= float(after[3]) < 60.0, text
    assert processes_of_job(job) == []
