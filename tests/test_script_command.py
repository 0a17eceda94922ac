"""Own-command mode, fast parts: the command template, DeepSpeed's arg_mappings convention, classification,
and memory sampling of a real process tree from outside."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.conftest import run_cli
from tests.fakes.launchers import OwnCommandLauncher

from autotune.core.ladder import Rung
from autotune.dsconfig.launchers import FREE_PORT
from autotune.errors import UserError
from autotune.trial.launch.processes import TRIAL_TAG_ENV, new_tag, stop_processes
from autotune.trial.outcome import BudgetBreach
from autotune.trial.own_command.script import ScriptOutcome, classify, placeholder_values
from autotune.trial.own_command.script_command import parse_command
from autotune.trial.own_command.script_memory import TreeMemorySampler, visible_gpu_indices
from autotune.trial.trial_types import TrialSpec

CONFIG = {
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 2},
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
}


def _spec(**changes: object) -> TrialSpec:
    values: dict = dict(model_config={}, architecture="GPT2LMHeadModel", family="decoder-only", ds_config=CONFIG,
                        seq_len=128, device="cpu", nprocs_per_node=2, grad_checkpointing=True)  # fmt: skip
    values.update(changes)
    return TrialSpec(**values)


def test_placeholders_render_every_documented_value(tmp_path: Path) -> None:
    template = parse_command(["torchrun", "--nproc-per-node", "{gpus}", "train.py", "--deepspeed", "{ds_config}",
                              "--mb={micro_batch}", "--ga", "{grad_accum}", "--ckpt", "{grad_checkpointing}",
                              "--bf16", "{bf16}", "--fp16", "{fp16}", "--seq", "{seq_len}", "--out", "{trial_dir}",
                              "--json={{\"stage\": {zero_stage}}}", "--port", "{master_port}"])  # fmt: skip
    values = placeholder_values(_spec(), tmp_path, 1234)
    argv = template.render(values, tmp_path / "c.json", CONFIG)
    assert argv == ["torchrun", "--nproc-per-node", "2", "train.py", "--deepspeed", str(tmp_path / "c.json"),
                    "--mb=4", "--ga", "2", "--ckpt", "true", "--bf16", "true", "--fp16", "false", "--seq", "128",
                    "--out", str(tmp_path / "work"), '--json={"stage": 2}', "--port", "1234"]  # fmt: skip
    assert template.starts_ranks() and template.accepts_grad_checkpointing()


def test_unknown_placeholder_and_missing_config_are_one_line_errors() -> None:
    with pytest.raises(UserError, match=r"unknown placeholder\(s\) \{micro_bs\}"):
        parse_command(["python", "train.py", "--deepspeed", "{ds_config}", "--bs", "{micro_bs}"])
    with pytest.raises(UserError, match="must take the trial's DeepSpeed config"):
        parse_command(["python", "train.py", "--bs", "{micro_batch}"])


def test_arg_mappings_convention_rewrites_config_path_and_mapped_flags(tmp_path: Path) -> None:
    user_config = tmp_path / "ds_user.json"
    user_config.write_text(
        """{
          // hjson, as DeepSpeed reads it
          "train_micro_batch_size_per_gpu": "auto", "gradient_clipping": 0.5,
          "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
          "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}},
          "autotuning": {"enabled": true, "arg_mappings": {
             "train_micro_batch_size_per_gpu": "--per_device_train_batch_size",
             "gradient_accumulation_steps ": "--gradient_accumulation_steps"}},
        }"""
    )
    template = parse_command(["python", "run_clm.py", "--per_device_train_batch_size", "1",
                              f"--deepspeed={user_config}", "--output_dir", "out"])  # fmt: skip
    assert not template.uses_placeholders and not template.starts_ranks()
    trial = template.trial_config(CONFIG)
    argv = template.render(placeholder_values(_spec(), tmp_path, 1), tmp_path / "trial.json", trial)
    assert argv == ["python", "run_clm.py", "--per_device_train_batch_size", "4", f"--deepspeed={tmp_path}/trial.json",
                    "--output_dir", "out", "--gradient_accumulation_steps", "2"]  # fmt: skip
    # The user's keys survive, the tuned ones are the candidate's, the autotuning section is gone.
    assert trial["gradient_clipping"] == 0.5 and trial["scheduler"]["type"] == "WarmupLR"
    assert trial["zero_optimization"] == {"stage": 2} and trial["train_micro_batch_size_per_gpu"] == 4
    assert "autotuning" not in trial and trial["optimizer"] == CONFIG["optimizer"]
    assert not template.accepts_grad_checkpointing()


def _outcome(**changes: object) -> ScriptOutcome:
    values: dict = dict(exit_code=1, log_text="", metric=None, wall_s=1.0)
    values.update(changes)
    return ScriptOutcome(**values)


@pytest.mark.parametrize(
    ("log", "code", "status"),
    [
        ("Traceback\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", 1, "oom_gpu"),
        ("[rank1]: RuntimeError: CUDA error: out of memory", 1, "oom_gpu"),
        ("RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED", 1, "oom_gpu"),
        ("node:1:2 [1] NCCL WARN Cuda failure 'out of memory'\nDistBackendError: NCCL error", 1, "oom_gpu"),
        ("include/alloc.h:103 NCCL WARN Failed to CUDA calloc 6291456 bytes", 1, "oom_gpu"),
        ("RuntimeError: [enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory", 1, "oom_host"),
        ("MemoryError", 1, "oom_host"),
        ("", 137, "inconclusive"),  # SIGKILL with no OOM evidence: from outside, not a memory verdict
        ("", -9, "inconclusive"),
        ("", -11, "inconclusive"),  # SIGSEGV
        ("", 134, "inconclusive"),  # SIGABRT through a shell
        ("rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 77)", 1, "inconclusive"),
        ("RuntimeError: CUDA driver error: out of memory", 1, "oom_gpu"),
        ("OSError: [Errno 28] No space left on device", 1, "inconclusive"),
        ("torch.distributed.DistNetworkError: The client socket has failed to connect", 1, "inconclusive"),
        ("Traceback (most recent call last):\nValueError: user code failed\nChildFailedError: x", 1, "error"),
        ("", 0, "incomplete"),
        ("", 3, "error"),
    ],
)
def test_classification_of_failures(log: str, code: int, status: str) -> None:
    got, reason = classify(_outcome(log_text=log, exit_code=code), 60, 5)
    assert got == status
    assert reason


def test_classification_names_the_root_line_and_the_missing_steps() -> None:
    _, reason = classify(_outcome(log_text="x\nValueError: user code failed\nRuntimeError: peer gone"), 60, 5)
    assert reason == "ValueError: user code failed"
    _, reason = classify(_outcome(exit_code=0), 60, 5)
    assert "without reaching the profiled steps" in reason and "step 6" in reason
    assert classify(_outcome(timed_out=True, exit_code=None), 60, 5)[0] == "timeout"
    breach = BudgetBreach(0, 3 * 2**30, 2**30)
    assert classify(_outcome(breach=breach, exit_code=None), 60, 5) == ("over_budget", breach.message())
    assert classify(_outcome(exit_code=0, metric={"throughput": 3.0}), 60, 5) == ("ok", None)
    caught = "OutOfMemoryError: CUDA out of memory. (retrying with a smaller batch)"
    assert classify(_outcome(exit_code=0, log_text=caught, metric={"throughput": 3.0}), 60, 5) == ("ok", None)
    failed_after = "x\nRuntimeError: NCCL communicator was aborted"
    assert classify(_outcome(exit_code=1, log_text=failed_after, metric={}), 60, 5)[0] == "error"


def test_visible_gpu_indices_follow_cuda_visible_devices() -> None:
    assert visible_gpu_indices({"CUDA_VISIBLE_DEVICES": "3,1"}, 2) == [3, 1]
    assert visible_gpu_indices({}, 2) == [0, 1]
    assert visible_gpu_indices({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}, 1) == [0]


_CHILD = """
import os, subprocess, sys, time
block = bytearray(int(sys.argv[1]) * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1
if sys.argv[2] == "spawn":
    env = {**os.environ, "RANK": "0"}
    subprocess.Popen([sys.executable, __file__, "8", "leaf"], env=env)
time.sleep(60)
"""


def test_tree_sampler_measures_rank_trees_and_gpus_from_outside(tmp_path: Path) -> None:
    """A launcher (no RANK) with a rank 0 process that forks a worker: rank 0's figure is its tree."""
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    tag = new_tag()
    launcher = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, os, time;"
         f"subprocess.Popen([sys.executable, {str(script)!r}, '96', 'spawn'], env={{**os.environ, 'RANK': '0'}});"
         "time.sleep(60)"],
        env={"PATH": "/usr/bin:/bin", TRIAL_TAG_ENV: tag},
    )  # fmt: skip
    used = {0: 10 * 2**30, 1: 5 * 2**30}
    sampler = TreeMemorySampler(tag, "cuda", [1], read_gpus=lambda: dict(used))
    try:
        sampler.start()
        used[1] = 7 * 2**30
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sampler.rank_peaks.get(0, 0) < 100 * 2**20:
            sampler.sample()
            time.sleep(0.2)
    finally:
        stop_processes(launcher, tag, grace_s=1.0)
    (metrics,) = sampler.metrics(range(1))
    assert metrics.host_rss_peak_bytes is not None and metrics.host_rss_peak_bytes >= 100 * 2**20
    assert sampler.tree_peak > metrics.host_rss_peak_bytes  # the launcher counts in the tree only
    assert metrics.device_used_bytes == 2 * 2**30 and metrics.device_used_baseline_bytes == 5 * 2**30  # own growth


def test_cli_rejects_a_bad_command_in_one_line(tmp_path: Path) -> None:
    done = run_cli("--model", "tiny-gpt2", "--device", "cpu", "--no-cache", "-o", str(tmp_path / "c.json"),
                   "--", "python", "train.py", "--deepspeed", "{ds_config}", "--bs", "{batch}")  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "unknown placeholder(s) {batch}" in done.stderr
    done = run_cli("--model", "tiny-gpt2", "--device", "cpu", "--gpus", "2", "--no-cache", "--",
                   "python", "train.py", "--deepspeed", "{ds_config}")  # fmt: skip
    assert done.returncode == 2 and "needs a launcher" in done.stderr
    assert not json.dumps(done.stderr).count("Traceback")


def test_hook_takes_the_same_command_form_and_keys_on_it(tmp_path: Path) -> None:

    from autotune.hook.env import JobEnv
    from autotune.hook.run import job_key
    from autotune.tuner import TuneRequest

    job = JobEnv("none", None, 1, 1, rank=0, node_rank=0, local_rank=0, nodelist=(), master_addr=None)
    plain = TuneRequest.of(model="tiny-gpt2", device="cpu")
    own = plain.updated(command=("python", "train.py", "--deepspeed", "{ds_config}"))
    assert job_key(plain, job) != job_key(own, job)  # a published synthetic answer is not reused for a script
    command = ["python", "train.py", "--deepspeed", "{ds_config}", "{nope}"]
    out = str(tmp_path / "c.json")
    options = ["--model", "tiny-gpt2", "--device", "cpu", "--cache-dir", str(tmp_path), "-o", out]
    done = run_cli("hook", *options, "--", *command)
    assert done.returncode == 2 and "unknown placeholder(s) {nope}" in done.stderr and "Traceback" not in done.stderr


def test_tune_in_own_command_mode_emits_the_users_config_without_hooks_and_reports_the_commands(
    tmp_path: Path,
) -> None:
    from autotune.trial.launch.chooser import build_launcher, choose_launch
    from autotune.trial.own_command.script import ScriptLauncher
    from autotune.tuner import TuneRequest, tune
    from autotune.tuning.trials import request_facts

    def script_launcher(request: TuneRequest) -> ScriptLauncher | None:
        """The one launcher chooser's pick for `request` when it is the user's command (trial/launch/chooser.py)."""
        facts = request_facts(request, {})
        choice = choose_launch(facts)
        launcher = build_launcher(facts, choice) if choice.kind == "own_command" else None
        assert launcher is None or isinstance(launcher, ScriptLauncher)
        return launcher

    user_config = tmp_path / "ds.json"
    user_config.write_text(json.dumps({"scheduler": {"type": "WarmupLR"}, "autotuning": {"enabled": True,
                                       "arg_mappings": {"train_micro_batch_size_per_gpu": "--bs"}}}))  # fmt: skip
    command = ("python", "train.py", "--deepspeed", str(user_config), "--bs", "1")
    request = TuneRequest.of(model="tiny-gpt2", device="cpu", memory_budget="2GiB", seq_len=64, micro_batches=(2, 4),
                          rungs=(Rung.Z0,), out=str(tmp_path / "out" / "ds_config.json"), use_cache=False,
                          command=command)  # fmt: skip
    assert isinstance(script_launcher(request), ScriptLauncher)
    assert script_launcher(TuneRequest.of(model="tiny-gpt2")) is None
    hooks = script_launcher(request).trial_config(_spec(), tmp_path / "m.json")["autotuning"]  # type: ignore[union-attr]
    assert hooks == {"enabled": True, "start_profile_step": 3, "end_profile_step": 5,
                     "metric_path": str(tmp_path / "m.json")}  # fmt: skip
    result = tune(request, launcher=OwnCommandLauncher())
    config = json.loads(Path(result.config_path).read_text())  # type: ignore[arg-type]
    assert config["scheduler"] == {"type": "WarmupLR"} and "autotuning" not in config
    own = result.report.own_command.to_json()
    # `--deepspeed FILE` is an HF Trainer command's form: it gets the .hf.json, the user's keys kept as written
    hf_path = Path(result.config_path).with_suffix(".hf.json")  # type: ignore[arg-type]
    assert own["train_command"].endswith(f"--deepspeed {hf_path} --bs 4")
    assert json.loads(hf_path.read_text())["scheduler"] == {"type": "WarmupLR"}
    assert all(t.result.command for t in result.report.trials)
    markdown = Path(result.report_path).read_text()  # type: ignore[arg-type]
    assert "## Your command" in markdown and "`python train.py --mb=4`" in markdown


def test_hook_leaves_own_command_trials_to_the_tuner(tmp_path: Path) -> None:
    """The hook's launcher choice (synthetic workers) must not replace the user's command: the facts it hands tune
    carry the command, and the one chooser (trial/launch/chooser.py) runs it."""
    from tests.fakes.hook import FakeTune, hook_request

    from autotune.hook import run_hook
    from autotune.trial.launch.chooser import JobFacts, choose_launch

    fake = FakeTune()
    command = ("python", "train.py", "--deepspeed", "{ds_config}")
    request = hook_request(tmp_path / "c.json", tmp_path / "shared", command=command)
    run_hook(request, environ={}, tune_fn=fake)
    [facts] = fake.launchers
    assert isinstance(facts, JobFacts) and facts.command == command and choose_launch(facts).kind == "own_command"
    assert fake.requests[0].training.command == command


def test_the_command_is_part_of_the_request_its_validation_and_the_cache_keys(tmp_path: Path) -> None:
    """One request, one context: the command is checked by TuneRequest's validate(), is part of the context's
    question (trials and answer keys), and a stored own-command answer is served again (the emitted config,
    user's base config merged, is what cached_answer compares)."""

    from autotune.request.context import TuneContext
    from autotune.request.validation import validate
    from autotune.tuner import TuneRequest, tune

    with pytest.raises(UserError, match=r"unknown placeholder\(s\) \{nope\}"):
        validate(TuneRequest.of(model="tiny-gpt2", command=("python", "t.py", "--deepspeed", "{ds_config}", "{nope}")))
    user_config = tmp_path / "ds.json"
    user_config.write_text(json.dumps({"scheduler": {"type": "WarmupLR"}}))
    request = TuneRequest.of(model="tiny-gpt2", device="cpu", memory_budget="2GiB", seq_len=64, micro_batches=(2, 4),
                          rungs=(Rung.Z0,), out=str(tmp_path / "out" / "ds_config.json"), cache_dir=str(tmp_path / "c"),
                          command=("python", "train.py", "--deepspeed", str(user_config)))  # fmt: skip
    synthetic = request.updated(command=None)
    own_ctx, plain_ctx = TuneContext.build(request), TuneContext.build(synthetic)
    assert own_ctx.key != plain_ctx.key and own_ctx.answer_key != plain_ctx.answer_key
    first = tune(request, launcher=OwnCommandLauncher())
    again = tune(request, launcher=OwnCommandLauncher())
    assert not first.from_cache and again.from_cache and again.trials_launched == 0
    assert again.ds_config == first.ds_config and first.ds_config["scheduler"] == {"type": "WarmupLR"}  # type: ignore[index]
    assert again.report.own_command.train_command == first.report.own_command.train_command


def test_the_printed_command_carries_the_environment_its_trials_had(tmp_path: Path) -> None:
    """Without a launcher the trials set the one-rank variables; printed without them, `python3 train.py`
    made DeepSpeed look for MPI ("No module named 'mpi4py'"). The end-to-end run is in test_script_mode.py."""
    from autotune.request.own_command_mode import train_command

    bare = parse_command(["python3", "train.py", "--deepspeed_config", "{ds_config}", "--mb", "{micro_batch}"])
    line = train_command(bare, _spec(nprocs_per_node=1), tmp_path / "ds config.json")
    assert line == (
        "DS_ACCELERATOR=cpu RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1"
        f" MASTER_PORT={FREE_PORT} python3 train.py --deepspeed_config '{tmp_path / 'ds config.json'}' --mb 4"
    )
    port = subprocess.run(["bash", "-c", f"echo {FREE_PORT}"], capture_output=True, text=True, check=True).stdout
    assert 0 < int(port) < 65536
    launched = parse_command(["torchrun", "--nproc-per-node", "{gpus}", "train.py", "--deepspeed", "{ds_config}"])
    on_gpu = train_command(launched, _spec(device="cuda"), tmp_path / "c.json")
    # the launcher's ranks; `--deepspeed FILE` is an HF Trainer command's form, so the .hf.json
    assert on_gpu == f"torchrun --nproc-per-node 2 train.py --deepspeed {tmp_path / 'c.hf.json'}"


@pytest.mark.parametrize(
    ("argv", "consumer"),
    [
        (["python3", "train_hf.py", "--deepspeed", "{ds_config}", "--per_device_train_batch_size", "{micro_batch}"],
         "hf"),
        (["torchrun", "--nproc-per-node", "{gpus}", "train_hf.py", "--deepspeed={ds_config}"], "hf"),
        (["python3", "train.py", "--deepspeed", "--deepspeed_config", "{ds_config}"], "deepspeed"),
        (["python3", "train.py", "--deepspeed_config={ds_config}"], "deepspeed"),
        (["python3", "train.py", "--config", "{ds_config}"], "deepspeed"),
        (["python3", "train.py", "--config", "{ds_config}", "--learning_rate", "5e-5"], "hf"),
    ],
)  # fmt: skip
def test_an_hf_trainer_command_is_told_from_a_plain_deepspeed_one(argv: list[str], consumer: str) -> None:
    assert parse_command(argv).consumer() == consumer


def test_an_hf_trainer_command_reads_the_hf_variant_with_its_own_lr_and_clipping() -> None:
    config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {}}}  # fmt: skip
    hf = parse_command(["python3", "t.py", "--deepspeed", "{ds_config}"]).config_for_consumer(config)
    assert hf["optimizer"]["params"]["lr"] == "auto" and hf["gradient_clipping"] == "auto"
    assert hf["train_micro_batch_size_per_gpu"] == 4  # tuned values stay concrete
    plain = parse_command(["python3", "t.py", "--deepspeed_config", "{ds_config}"]).config_for_consumer(config)
    assert plain == config


def test_consumer_option_overrides_what_the_command_shows_and_is_checked(tmp_path: Path) -> None:
    forced = parse_command(["python3", "t.py", "--deepspeed", "{ds_config}"], consumer="deepspeed")
    assert forced.consumer() == "deepspeed"
    options = ["--model", "tiny-gpt2", "--device", "cpu", "--memory-budget", "1GiB", "-o", str(tmp_path / "c.json")]
    done = run_cli(*options, "--consumer", "hf")
    assert done.returncode == 2 and "give the command after `--`" in done.stderr and "Traceback" not in done.stderr
    done = run_cli(*options, "--consumer", "trainer", "--", "python3", "t.py", "--deepspeed", "{ds_config}")
    assert done.returncode == 2 and "--consumer must be hf or deepspeed" in done.stderr
    assert not (tmp_path / "c.json").exists()
