"""The tuner's side of own-command mode (`autotune --model M --gpus N -- <command>`): checks, the emitted
config and the report section. Kept apart from tuner.py so the mode stays one selection point there."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.dsconfig.launchers import FREE_PORT, accelerator_prefix
from autotune.errors import UserError
from autotune.trial.launch.processes import one_rank_env
from autotune.trial.own_command.script import END_PROFILE_STEP, START_PROFILE_STEP, final_command
from autotune.trial.own_command.script_command import CommandTemplate, parse_command

if TYPE_CHECKING:
    from autotune.request.tune_request import TuneRequest
    from autotune.trial.trial_types import TrialSpec


def _template(request: TuneRequest) -> CommandTemplate:
    return parse_command(request.training.command or (), consumer=request.training.consumer)


def check_command(request: TuneRequest) -> None:
    """Fail before any trial on a command no trial could run."""
    template = _template(request)
    if request.hardware.nodes > 1:
        raise UserError("own-command trials run on one node; tune with --nodes 1 (the config holds per rank)")
    if (request.hardware.gpus or 1) > 1 and not template.starts_ranks():
        raise UserError(
            f"--gpus {request.hardware.gpus} needs a launcher in the command (torchrun --nproc-per-node {{gpus}} ... or"
            " deepspeed --num_gpus {gpus} ...)"
        )


def emitted_config(request: TuneRequest, candidate_config: dict[str, Any]) -> dict[str, Any]:
    """What the user trains with: the trial's config without the autotuning hooks (DeepSpeed's own
    `ds_config_optimal.json` keeps them enabled, so the job would exit after a few steps)."""
    config = _template(request).trial_config(candidate_config)
    config.pop("autotuning", None)
    return config


def command_base(request: TuneRequest) -> dict[str, Any] | None:
    """The config file the command names (convention form), else None."""
    return _template(request).base_config


def command_report(request: TuneRequest, spec: TrialSpec, config_path: Path) -> dict[str, Any]:
    template = _template(request)
    return {
        "template": list(template.argv),
        "form": "placeholders" if template.uses_placeholders else "arg_mappings (DeepSpeed Autotuning convention)",
        "placeholders": sorted(template.placeholders()),
        "arg_mappings": template.arg_mappings,
        "metric": (
            "median wall clock of your command's whole optimizer steps, timed at DeepSpeed's step boundaries on every"
            f" rank (slowest rank) after step {END_PROFILE_STEP + 1}, data loading included; secondary: the engine's"
            f" profiled step (forward+backward+step timers of step {END_PROFILE_STEP + 1}, flops profiled at step"
            f" {START_PROFILE_STEP}, rank 0), which excludes the script's own work between engine calls"
        ),
        "train_command": train_command(template, spec, config_path),
    }


def train_command(template: CommandTemplate, spec: TrialSpec, config_path: Path) -> str:
    """The user's command as it runs outside the tuner: with the chosen values, and with the environment the
    trials gave it. A command without a launcher gets the one-rank variables torchrun would set (else
    `deepspeed.init_distributed` falls back to MPI discovery: "No module named 'mpi4py'"), on a port free
    when it runs; on the CPU backend, DS_ACCELERATOR=cpu. An HF Trainer command names the .hf.json written beside
    the config (CommandTemplate.consumer): the file its trials read."""
    if template.consumer() == "hf":
        config_path = config_path.with_suffix(".hf.json")
    argv = shlex.join(final_command(template, spec, config_path))
    variables = {**one_rank_env(port=0), "MASTER_PORT": FREE_PORT}  # a free port: two jobs on a node do not collide
    rank_env = "" if template.starts_ranks() else "".join(f"{k}={v} " for k, v in variables.items())
    return f"{accelerator_prefix(spec.device)}{rank_env}{argv}"
