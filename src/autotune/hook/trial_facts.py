"""Where the hook's trials run: the job's facts for the one launcher chooser (trial/launch/chooser.py), which tune uses
too.

The hook knows more than `autotune tune` does: the job's node list (SLURM's, or --nodelist), its rendezvous address
and port, and a directory every node sees (the shared dir: trial directories, hostfiles and the warm workers' pool
directory go there). It hands those facts to tune, which decides with them exactly as it decides for itself (several
nodes, inside SLURM or as local CPU nodes: warm workers across the nodes, the pick confirmed in a fresh launch of all
of them); the hook decides once beforehand too, so a job that cannot run its trials (no srun, no pdsh, several GPU
nodes and no node list) fails before any tuning starts.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from autotune.hook.env import JobEnv
from autotune.request.tune_request import TuneRequest
from autotune.trial.launch.chooser import JobFacts, check_tools, choose_launch


def job_facts(job: JobEnv, tuning: TuneRequest, shared_dir: Path, environ: Mapping[str, str]) -> JobFacts:
    """The facts of `job` (its nodes, list, port), of the tuning asked for, and of this process's environment."""
    return JobFacts.of_process(
        environ,
        nodes=job.nodes,
        device=tuning.hardware.device,
        trial_workers=tuning.search.trial_workers,
        command=tuning.training.command,
        consumer=tuning.training.consumer,
        nodelist=job.nodelist,
        job_master_port=job.master_port,
        master_addr=job.master_addr,
        gpus_per_node=job.gpus_per_node,
        job_id=job.job_id,
        shared_dir=shared_dir,
    )


def choose_launcher(
    job: JobEnv,
    tuning: TuneRequest,
    shared_dir: Path,
    environ: Mapping[str, str],
    which: Callable[[str], str | None] = shutil.which,
) -> JobFacts:
    """The job's facts for tune, checked now: raises UserError where its trials could not run."""
    facts = job_facts(job, tuning, shared_dir, environ)
    check_tools(choose_launch(facts), which)
    return facts
