"""Warm workers across nodes (trial/launch/warm_nodes.py): how the nodes' launchers start, what the srun step is
given, where a failed rank is read, and the report's words for figures from a fresh full-scale launch. The real
two-"node" runs are tests/test_warm_nodes_cpu.py."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.fakes.reports import golden_report
from tests.fakes.trials import tiny_spec

from autotune.report.markdown import FRESH_PURPOSE, _launch_detail
from autotune.report.pick import memory_line
from autotune.search.records import LaunchPurpose
from autotune.trial.launch.nodes import LocalNodesLauncher
from autotune.trial.launch.processes import cpu_threads_per_rank, one_rank_env
from autotune.trial.launch.warm_nodes import LocalNodesStart, without_owner

SERVE = ["--serve", "/pool", "--device", "cpu", "--owner-pid", "4242"]


def test_every_nodes_torchrun_meets_at_one_master_with_its_own_node_rank() -> None:
    ports = iter([29611, 29622])
    start = LocalNodesStart(port_source=lambda: next(ports))
    commands = start.commands(tiny_spec(nodes=2), SERVE)
    assert [c for c in commands[0] if c.startswith("--node-rank")] == ["--node-rank=0"]
    assert [c for c in commands[1] if c.startswith("--node-rank")] == ["--node-rank=1"]
    assert all("--master-port=29611" in c and "--master-addr=127.0.0.1" in c and "--nnodes=2" in c for c in commands)
    assert all(c[-len(SERVE) :] == SERVE for c in commands)  # the same pool directory for every node's workers
    assert {c for c in start.commands(tiny_spec(nodes=2), SERVE)[0] if "master-port" in c} == {"--master-port=29622"}


def test_the_srun_step_serves_without_the_tuners_pid_which_no_other_node_has() -> None:
    assert without_owner(SERVE) == ["--serve", "/pool", "--device", "cpu"]
    assert without_owner(["--serve", "/pool"]) == ["--serve", "/pool"]


def test_a_failed_rank_is_read_from_its_own_nodes_torchrun_log(tmp_path: Path) -> None:
    (tmp_path / "launcher.log").write_text("all fine\n")
    failure = "  rank      : 1 (local_rank: 0)\n  exitcode  : -9 (pid: 77)\n"
    (tmp_path / "launcher-node1.log").write_text(failure)
    assert LocalNodesStart().exit_codes(tiny_spec(nodes=2), tmp_path, [None, 1]) == {1: -9}


def test_a_one_node_trial_is_refused_by_the_nodes_start() -> None:
    with pytest.raises(Exception, match="several nodes"):
        LocalNodesStart().refuse(tiny_spec(nodes=1))


def test_the_reports_fresh_purpose_is_the_searchs() -> None:
    assert FRESH_PURPOSE == LaunchPurpose.FRESH


def test_the_report_says_which_figures_came_from_a_fresh_full_scale_launch() -> None:
    one = golden_report()
    assert _launch_detail(one).startswith(" in 1 process start(s) (warm workers)")
    two = dataclasses.replace(
        one,
        assumptions=dataclasses.replace(one.assumptions, nodes=2),
        process_starts=2,
        launches_by_purpose={"first of a group": 2, FRESH_PURPOSE: 1},
    )
    detail = _launch_detail(two)
    assert detail.startswith(" in 2 launch(es) of all 2 nodes: 1 fresh, full-scale (fresh-process confirmation)")
    assert "the others' figures from warm workers across the nodes" in detail
    assert dataclasses.replace(one, assumptions=two.assumptions).assumptions.nodes == 2
    assert one.choice is not None
    fresh_two = dataclasses.replace(two, choice=dataclasses.replace(one.choice, peak_in_fresh_process=True))
    assert "(in a fresh launch of all 2 nodes, as your job starts)" in memory_line(fresh_two)
    # no confirmation launched: the pick's own trial was the first of its launch (Pick.confirm_fresh)
    own = dataclasses.replace(fresh_two, launches_by_purpose={"first of a group": 2})
    assert _launch_detail(own).startswith(
        " in 2 launch(es) of all 2 nodes: the pick's own trial the first of its launch, so fresh and full-scale"
    )
    unconfirmed = dataclasses.replace(own, choice=one.choice)
    assert " 0 fresh, full-scale" in _launch_detail(unconfirmed)


# The globals DeepSpeed's ZeRO++ leaves (deepspeed/utils/groups.py), set as an hpZ and a qgZ build set them, in a
# one-rank gloo world: the rank's own groups, and the marker torch returns for a group it is not in.
_RELEASE_ON_THE_GLOBALS = """
import json, os, torch, deepspeed, deepspeed.comm as dist
from deepspeed.utils import groups
from autotune.trial.worker.deepspeed_globals import release_zeropp_groups, zeropp_groups_left
deepspeed.init_distributed("gloo")
groups._create_zero_param_parallel_group(1)
groups._ALL_TO_ALL_GROUP["local_0"] = dist.new_group(ranks=[0])
groups._ALL_TO_ALL_GROUP["global_1"] = torch.distributed.GroupMember.NON_GROUP_MEMBER
before = zeropp_groups_left()
left = release_zeropp_groups()
try:
    groups._create_zero_param_parallel_group(1)  # the next trial's hpZ build
    again = "ok"
except AssertionError as error:
    again = str(error)
print(json.dumps({"before": before, "left": left, "again": again, "all_to_all": list(groups._ALL_TO_ALL_GROUP)}))
"""


def test_the_release_destroys_the_ranks_zeropp_groups_and_drops_the_ones_it_is_not_in() -> None:
    """Real DeepSpeed, its globals set directly: after the release none is held (the non-member marker, which
    deepspeed.comm.destroy_process_group returns early for, comm.py:190-191, is dropped too) and an hpZ group can be
    made again."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", **one_rank_env()}
    run = subprocess.run([sys.executable, "-c", _RELEASE_ON_THE_GLOBALS], env=env, capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found == {"before": 3, "left": 0, "again": "ok", "all_to_all": []}


def test_nodes_on_this_host_split_its_cores_between_all_their_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every "node" here is a process of this host: OpenMP threads per rank are its cores over every node's ranks
    (two one-rank nodes given a node's worth each oversubscribed 2 cores and slowed ZeRO-0 ~18x), unless set."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    spec = tiny_spec(nodes=2)
    assert LocalNodesStart().ranks_per_host(spec) == 2
    want = str(cpu_threads_per_rank(2))
    assert {n.env["OMP_NUM_THREADS"] for n in LocalNodesLauncher(port_source=lambda: 29700).launchers(spec)} == {want}
    given = LocalNodesLauncher(env={"OMP_NUM_THREADS": "3"}, port_source=lambda: 29701).launchers(spec)
    assert {n.env["OMP_NUM_THREADS"] for n in given} == {"3"}
