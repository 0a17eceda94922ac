"""Job environment detection for `autotune hook`: SLURM host lists, GPU counts, torchrun, contradictions."""

from __future__ import annotations

import pytest

from autotune.errors import UserError
from autotune.hook.env import JobOverrides, detect_job_env, parse_gpu_count
from autotune.hook.hostlist import expand_hostlist, parse_hostlist
from autotune.trial.launch.hostfile import hostfile_text, read_hostfile, write_hostfile


def no_scontrol(text: str) -> None:
    return None


def visible(count: int):
    return lambda: count


SLURM_2x8 = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_GPUS_ON_NODE": "8",
    "SLURM_PROCID": "9",
    "SLURM_NODEID": "1",
    "SLURM_LOCALID": "1",
}


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("gpu[01-03,07],cpu5", ["gpu01", "gpu02", "gpu03", "gpu07", "cpu5"]),
        ("node1", ["node1"]),
        ("a,b,c", ["a", "b", "c"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[008-010]", ["n008", "n009", "n010"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("gpu-a100-[1,3]", ["gpu-a100-1", "gpu-a100-3"]),
    ],
)
def test_hostlist_expands_slurm_syntax(text: str, hosts: list[str]) -> None:
    assert parse_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["gpu[01-03", "gpu01-03]", "gpu[]", "gpu[a-b]", "gpu[3-1]", "gpu[[1]]", ""])
def test_malformed_hostlist_is_a_user_error(text: str) -> None:
    with pytest.raises(UserError):
        parse_hostlist(text)


def test_scontrol_wins_when_it_answers_and_the_parser_covers_when_it_does_not() -> None:
    assert expand_hostlist("gpu[1-2]", lambda text: ["x", "y"]) == ["x", "y"]
    assert expand_hostlist("gpu[1-2]", no_scontrol) == ["gpu1", "gpu2"]


@pytest.mark.parametrize(
    ("text", "count"), [("8", 8), ("a100:8", 8), ("gpu:a100:8", 8), ("gpu:a100:4(S:0-1)", 4), ("a100:4,v100:2", 6)]
)
def test_gpu_counts_as_slurm_writes_them(text: str, count: int) -> None:
    assert parse_gpu_count(text) == count


def test_gpu_count_that_is_not_a_number_is_a_user_error() -> None:
    with pytest.raises(UserError, match="SLURM_GPUS_PER_NODE"):
        parse_gpu_count("a100:many")


def test_slurm_job_gives_world_size_nodes_ranks_and_master() -> None:
    job = detect_job_env(SLURM_2x8, visible_gpus=visible(8), scontrol=no_scontrol)
    assert (job.scheduler, job.job_id, job.nodes, job.gpus_per_node, job.world_size) == ("slurm", "4242", 2, 8, 16)
    assert (job.rank, job.node_rank, job.local_rank) == (9, 1, 1)
    assert job.nodelist == ("gpu07", "gpu08")
    assert job.master_addr == "gpu07"


def test_slurm_gpus_per_node_with_a_type_and_only_nnodes() -> None:
    env = {"SLURM_JOB_ID": "1", "SLURM_NNODES": "1", "SLURM_NODELIST": "n1", "SLURM_GPUS_PER_NODE": "gpu:a100:4"}
    job = detect_job_env(env, visible_gpus=visible(4), scontrol=no_scontrol)
    assert (job.nodes, job.gpus_per_node, job.rank, job.master_addr) == (1, 4, 0, "n1")


def test_slurm_says_8_gpus_but_2_are_visible_is_a_clear_error() -> None:
    with pytest.raises(UserError, match=r"SLURM_GPUS_ON_NODE=8 says 8 GPU\(s\) per node but 2 are visible"):
        detect_job_env(SLURM_2x8, visible_gpus=visible(2), scontrol=no_scontrol)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"SLURM_JOB_NUM_NODES": None, "SLURM_NNODES": None}, "neither SLURM_JOB_NUM_NODES nor SLURM_NNODES"),
        ({"SLURM_JOB_NODELIST": "gpu[07-09]"}, "names 3 node"),
        ({"SLURM_GPUS_PER_NODE": "a100:4"}, "SLURM_GPUS_ON_NODE=8 but SLURM_GPUS_PER_NODE=a100:4"),
        ({"SLURM_JOB_NUM_NODES": "two"}, "not a whole number"),
        ({"SLURM_GPUS_ON_NODE": "0"}, "no GPU to train on"),
    ],
)
def test_contradictory_or_missing_slurm_environment(change: dict, message: str) -> None:
    env = {k: v for k, v in {**SLURM_2x8, **change}.items() if v is not None}
    with pytest.raises(UserError, match=message):
        detect_job_env(env, visible_gpus=visible(8), scontrol=no_scontrol)


def test_flags_must_agree_with_slurm() -> None:
    with pytest.raises(UserError, match="--gpus 4 contradicts SLURM_GPUS_ON_NODE=8"):
        detect_job_env(SLURM_2x8, JobOverrides(gpus=4), visible_gpus=visible(8), scontrol=no_scontrol)
    with pytest.raises(UserError, match="--nodes 3 contradicts"):
        detect_job_env(SLURM_2x8, JobOverrides(nodes=3), visible_gpus=visible(8), scontrol=no_scontrol)


def test_slurm_without_gpu_variables_uses_what_is_visible_or_the_flag() -> None:
    env = {"SLURM_JOB_ID": "1", "SLURM_NNODES": "1", "SLURM_NODELIST": "n1"}
    assert detect_job_env(env, visible_gpus=visible(4), scontrol=no_scontrol).gpus_per_node == 4
    assert detect_job_env(env, JobOverrides(gpus=2), visible_gpus=visible(4), scontrol=no_scontrol).gpus_per_node == 2
    with pytest.raises(UserError, match="no GPU visible"):
        detect_job_env(env, visible_gpus=visible(0), scontrol=no_scontrol)


def test_cpu_backend_never_looks_at_gpus() -> None:
    def must_not_probe() -> int:
        raise AssertionError("probed GPUs for --device cpu")

    job = detect_job_env(SLURM_2x8, device="cpu", visible_gpus=must_not_probe, scontrol=no_scontrol)
    assert job.world_size == 16  # SLURM's count still shapes the CPU world


def test_torchrun_environment() -> None:
    env = {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "none",
    }
    job = detect_job_env(env, visible_gpus=visible(4), scontrol=no_scontrol)
    assert (job.scheduler, job.nodes, job.gpus_per_node, job.rank, job.node_rank) == ("torchrun", 2, 4, 5, 1)
    assert (job.master_addr, job.master_port, job.job_id) == ("10.0.0.1", 29500, None)


def test_torchrun_inside_slurm_takes_the_job_id_and_node_list() -> None:
    env = {**SLURM_2x8, "RANK": "0", "WORLD_SIZE": "16", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"}
    job = detect_job_env(env, visible_gpus=visible(8), scontrol=no_scontrol)
    assert (job.scheduler, job.job_id, job.nodelist) == ("torchrun", "4242", ("gpu07", "gpu08"))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "0", "WORLD_SIZE": "2"}, "incomplete torchrun environment: LOCAL_RANK, LOCAL_WORLD_SIZE"),
        ({"RANK": "0", "WORLD_SIZE": "6", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"}, "not a multiple"),
        ({**SLURM_2x8, "RANK": "0", "WORLD_SIZE": "8", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"}, "names 2 node"),
    ],
)
def test_contradictory_torchrun_environment(env: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        detect_job_env(env, visible_gpus=visible(8), scontrol=no_scontrol)


def test_no_scheduler_uses_flags_and_visible_gpus() -> None:
    job = detect_job_env({}, visible_gpus=visible(2), scontrol=no_scontrol)
    assert (job.scheduler, job.nodes, job.gpus_per_node, job.job_id) == ("none", 1, 2, None)
    job = detect_job_env({}, JobOverrides(nodelist="h[1-2]"), device="cpu", scontrol=no_scontrol)
    assert (job.nodes, job.gpus_per_node, job.master_addr) == (2, 1, "h1")
    with pytest.raises(UserError, match="--gpus 4 says 4 GPU"):
        detect_job_env({}, JobOverrides(gpus=4), visible_gpus=visible(2), scontrol=no_scontrol)
    with pytest.raises(UserError, match="names 2 node"):
        detect_job_env({}, JobOverrides(nodes=3, nodelist="h[1-2]"), device="cpu", scontrol=no_scontrol)


def test_hostfile_round_trip_and_atomic_write(tmp_path) -> None:
    assert hostfile_text(["gpu07", "gpu08"], 8) == "gpu07 slots=8\ngpu08 slots=8\n"
    path = write_hostfile(tmp_path / "hostfile", ["gpu07", "gpu08"], 8)
    assert read_hostfile(path) == [("gpu07", 8), ("gpu08", 8)]
    assert [p.name for p in tmp_path.iterdir()] == ["hostfile"]  # no temp file left behind
    with pytest.raises(UserError, match="repeats a host"):
        hostfile_text(["a", "a"], 1)
