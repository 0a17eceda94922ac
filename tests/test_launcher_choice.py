"""One launcher chooser (trial/launch/chooser.py): every combination of nodes x SLURM x torchrun x --trial-workers x
device,
decided by `autotune tune` from its own request and environment and by the hook from the job's facts, gives the same
launchers; the table's rows are spelled out here, apart from the code. No process starts: the warm pool starts its
workers at its first trial, and the srun/pdsh launchers are only built."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from tests.fakes.hook import job_env

from autotune.errors import UserError
from autotune.hook.env import JobEnv
from autotune.hook.trial_facts import choose_launcher
from autotune.request.tune_request import TuneRequest
from autotune.trial import FreshAfterWarm, HostfileLauncher, LocalLauncher, SlurmLauncher, WarmWorkerPool
from autotune.trial.launch.chooser import TrialLaunchers
from autotune.trial.launch.hostfile import TRIAL_MASTER_PORT
from autotune.trial.launch.nodes import LocalNodesLauncher
from autotune.trial.launch.warm import OneNodeStart
from autotune.trial.launch.warm_nodes import LocalNodesStart, SrunStart
from autotune.trial.own_command.script import ScriptLauncher
from autotune.tuning.trials import launcher_for

CPU_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}
NO_AGENT_STORE = {"TORCHELASTIC_USE_AGENT_STORE": "False"}
COMBINATIONS = list(itertools.product((1, 2), (False, True), (False, True), ("auto", "warm", "fresh"), ("cpu", "cuda")))


def every_tool(name: str) -> str:
    return f"/usr/bin/{name}"


def environment(*, slurm: bool, torchrun: bool) -> dict[str, str]:
    env = {"SLURM_JOB_ID": "9"} if slurm else {}
    return {**env, "TORCHELASTIC_USE_AGENT_STORE": "True"} if torchrun else env


def job(nodes: int, *, slurm: bool, nodelist: tuple[str, ...] = ()) -> JobEnv:
    return job_env(nodes, nodelist=nodelist, scheduler="slurm" if slurm else "none")


def expected(nodes: int, slurm: bool, torchrun: bool, workers: str, device: str) -> tuple | str:
    """The table of trial/launch/chooser.py's docstring, row by row: (trials, how its workers start, confirm, the
    confirmation's fresh launcher, env), or the refusal's words."""
    env = {**(CPU_ENV if device == "cpu" else {}), **(NO_AGENT_STORE if torchrun else {})}
    if nodes > 1:
        if slurm:
            env = {**env, "SLURM_OVERLAP": "1"}
            if workers == "fresh":
                return (SlurmLauncher, None, None, None, env)
            confirm = (FreshAfterWarm, SlurmLauncher) if workers == "auto" else (None, None)
            return (WarmWorkerPool, SrunStart, *confirm, env)  # on CPU too: nothing compared warm and fresh there
        if device != "cpu":
            return "no node list"
        if workers == "fresh":
            return (LocalNodesLauncher, None, None, None, env)
        confirm = (FreshAfterWarm, LocalNodesLauncher) if workers == "auto" else (None, None)
        return (WarmWorkerPool, LocalNodesStart, *confirm, env)
    if workers == "fresh":
        return (LocalLauncher, None, None, None, env)
    confirm = (FreshAfterWarm, LocalLauncher) if workers == "auto" and device == "cuda" else (None, None)
    return (WarmWorkerPool, OneNodeStart, *confirm, env)


def answer(chosen: TrialLaunchers) -> tuple:
    start = getattr(chosen.trials, "start", None)
    confirm = chosen.confirm
    fresh = getattr(confirm, "fresh", None)
    types = [None if part is None else type(part) for part in (start, confirm, fresh)]
    return (type(chosen.trials), *types, chosen.trials.env)  # type: ignore[attr-defined]


def tune_answer(request: TuneRequest, env: dict[str, str]) -> tuple | str:
    try:
        with launcher_for(request, None, environ=env, which=every_tool) as chosen:
            return answer(chosen)
    except UserError as error:
        return str(error)


def hook_answer(request: TuneRequest, env: dict[str, str], *, slurm: bool, shared: Path) -> tuple | str:
    try:
        facts = choose_launcher(job(request.hardware.nodes, slurm=slurm), request, shared, env, which=every_tool)
        with launcher_for(request, facts, which=every_tool) as chosen:
            return answer(chosen)
    except UserError as error:
        return str(error)


@pytest.mark.parametrize(("nodes", "slurm", "torchrun", "workers", "device"), COMBINATIONS)
def test_tune_and_hook_choose_the_same_launchers(
    nodes: int, slurm: bool, torchrun: bool, workers: str, device: str, tmp_path: Path
) -> None:
    request = TuneRequest.of(model="tiny-gpt2", device=device, nodes=nodes, trial_workers=workers)
    env = environment(slurm=slurm, torchrun=torchrun)
    want = expected(nodes, slurm, torchrun, workers, device)
    tune, hook = tune_answer(request, env), hook_answer(request, env, slurm=slurm, shared=tmp_path)
    if isinstance(want, str):
        assert isinstance(tune, str) and isinstance(hook, str)
        assert want in tune and tune == hook
    else:
        assert tune == hook == want


def test_the_table_is_every_combination() -> None:
    assert len(COMBINATIONS) == len(set(COMBINATIONS)) == 2 * 2 * 2 * 3 * 2


@pytest.mark.parametrize("torchrun", [False, True])
def test_a_node_list_outside_slurm_runs_the_deepspeed_launcher_over_a_hostfile(torchrun: bool, tmp_path: Path) -> None:
    """Only the hook knows a node list (tune has no --nodelist): its trials reach the nodes with pdsh, on CPU and
    GPUs, on a port clear of the job's own."""
    for device in ("cpu", "cuda"):
        request = TuneRequest.of(model="tiny-gpt2", device=device, nodes=2)
        env = environment(slurm=False, torchrun=torchrun)
        the_job = JobEnv(
            "none",
            "9",
            2,
            4,
            rank=0,
            node_rank=0,
            local_rank=0,
            nodelist=("h1", "h2"),
            master_addr="h1",
            master_port=TRIAL_MASTER_PORT,
        )
        facts = choose_launcher(the_job, request, tmp_path, env, which=every_tool)
        with launcher_for(request, facts, which=every_tool) as chosen:
            launcher = chosen.trials
        assert isinstance(launcher, HostfileLauncher) and chosen.confirm is None
        assert launcher.hostfile.read_text() == "h1 slots=4\nh2 slots=4\n"
        assert launcher.master_port == TRIAL_MASTER_PORT + 1 and launcher.workdir == tmp_path / "trials"
        want = {**(CPU_ENV if device == "cpu" else {}), **(NO_AGENT_STORE if torchrun else {})}
        assert launcher.env == want


def test_srun_trials_from_the_hook_go_to_the_shared_dir_with_the_first_node_as_master(tmp_path: Path) -> None:
    """The warm step and the fresh confirmation's step alike: the shared dir, the first node, the trials' port."""
    request = TuneRequest.of(model="tiny-gpt2", device="cuda", nodes=2)
    facts = choose_launcher(
        job(2, slurm=True, nodelist=("gpu07", "gpu08")), request, tmp_path, {"SLURM_JOB_ID": "9"}, which=every_tool
    )
    with launcher_for(request, facts, which=every_tool) as chosen:
        pool, confirm = chosen.trials, chosen.confirm
    assert isinstance(pool, WarmWorkerPool) and isinstance(pool.start, SrunStart)
    assert pool.workdir == tmp_path / "trials" and pool.start.master_addr == "gpu07"
    assert pool.start.master_port == TRIAL_MASTER_PORT
    assert isinstance(confirm, FreshAfterWarm) and isinstance(confirm.fresh, SlurmLauncher)
    fresh = confirm.fresh
    assert fresh.workdir == tmp_path / "trials" and fresh.master_addr == "gpu07"
    assert fresh.master_port == TRIAL_MASTER_PORT


def test_warm_over_a_node_list_outside_slurm_is_refused_in_one_line(tmp_path: Path) -> None:
    """pdsh-reached nodes run fresh trials only: `auto` goes there, `warm` is refused before any tuning."""
    request = TuneRequest.of(model="tiny-gpt2", device="cuda", nodes=2, trial_workers="warm")
    with pytest.raises(UserError, match="over a node list"):
        choose_launcher(job(2, slurm=False, nodelist=("h1", "h2")), request, tmp_path, {}, which=every_tool)


@pytest.mark.parametrize("nodes", [1, 2])
def test_an_own_command_runs_every_trial_itself_from_tune_and_hook(nodes: int, tmp_path: Path) -> None:
    command = ("python", "train.py", "--deepspeed", "{ds_config}")
    request = TuneRequest.of(model="tiny-gpt2", device="cpu", nodes=nodes, command=command)
    with launcher_for(request, None, environ={}) as tuned:
        assert isinstance(tuned.trials, ScriptLauncher) and tuned.confirm is None
    facts = choose_launcher(job(nodes, slurm=False), request, tmp_path, {}, which=every_tool)
    with launcher_for(request, facts) as hooked:
        assert isinstance(hooked.trials, ScriptLauncher) and hooked.confirm is None


def test_missing_client_tools_fail_the_hook_before_it_tunes(tmp_path: Path) -> None:
    request = TuneRequest.of(model="tiny-gpt2", device="cuda", nodes=2)
    none = lambda name: None  # noqa: E731
    with pytest.raises(UserError, match="srun, which is not on PATH"):
        choose_launcher(job(2, slurm=True, nodelist=("h1", "h2")), request, tmp_path, {"SLURM_JOB_ID": "9"}, which=none)
    with pytest.raises(UserError, match="pdsh, which is not installed"):
        choose_launcher(job(2, slurm=False, nodelist=("h1", "h2")), request, tmp_path, {}, which=none)


def test_a_launcher_of_the_callers_is_used_as_given() -> None:
    request = TuneRequest.of(model="tiny-gpt2", device="cuda", nodes=2)
    given = LocalLauncher()
    with launcher_for(request, given, environ={}) as chosen:
        assert chosen.trials is given and chosen.confirm is None


def test_the_trials_rendezvous_at_the_jobs_own_master_address(tmp_path: Path) -> None:
    """MASTER_ADDR the job set (an interface of its first node, or a node not first) is where trials meet too."""
    request = TuneRequest.of(model="tiny-gpt2", device="cpu", nodes=2)
    the_job = JobEnv(
        "slurm", "9", 2, 1, rank=0, node_rank=0, local_rank=0, nodelist=("n1", "n2"), master_addr="10.0.0.5"
    )
    facts = choose_launcher(the_job, request, tmp_path, {"SLURM_JOB_ID": "9"}, which=every_tool)
    with launcher_for(request, facts, which=every_tool) as chosen:
        assert isinstance(chosen.trials, WarmWorkerPool) and isinstance(chosen.trials.start, SrunStart)
        assert chosen.trials.start.master_addr == "10.0.0.5"
        assert isinstance(chosen.confirm, FreshAfterWarm) and chosen.confirm.fresh.master_addr == "10.0.0.5"  # type: ignore[attr-defined]
