"""Write the chosen ds_config.json (validated by DeepSpeed at the target world size, atomically)
and say how to launch it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.atomic import atomic_write_json
from autotune.dsconfig import ConfigRejected, hf_variant, validate_with_deepspeed
from autotune.errors import UserError
from autotune.ladder import Candidate


@dataclass(frozen=True)
class LaunchCommands:
    deepspeed: str
    torchrun: str

    def to_dict(self) -> dict:
        return {"deepspeed": self.deepspeed, "torchrun": self.torchrun}


def launch_commands(
    config_path: Path, candidate: Candidate, gpus_per_node: int, nodes: int, script: str = "train.py"
) -> LaunchCommands:
    """Commands for a training script that takes --deepspeed (as HF Trainer scripts do)."""
    ckpt = " --gradient_checkpointing" if candidate.grad_checkpointing else ""
    multi = f" --num_nodes {nodes} --hostfile hostfile" if nodes > 1 else ""
    deepspeed = f"deepspeed{multi} --num_gpus {gpus_per_node} {script} --deepspeed {config_path}{ckpt}"
    rendezvous = f" --nnodes {nodes} --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500" if nodes > 1 else ""
    torchrun = f"torchrun{rendezvous} --nproc-per-node {gpus_per_node} {script} --deepspeed {config_path}{ckpt}"
    return LaunchCommands(deepspeed=deepspeed, torchrun=torchrun)


def write_configs(
    config: dict[str, Any], world_size: int, out_path: Path, hf: bool = False, validate: bool = True
) -> tuple[Path, Path | None]:
    """Validate with DeepSpeed's parser at `world_size`, then write; nothing is written on refusal.

    With hf=True a second file `<stem>.hf.json` holds the "auto" variant for HF Trainer / Accelerate.
    validate=False is for configs already validated at this world size by this DeepSpeed version (a
    cache hit), which spares importing DeepSpeed.
    """
    if validate:
        try:
            validate_with_deepspeed(config, world_size)
        except ConfigRejected as error:
            raise UserError(f"DeepSpeed rejected the generated config at world size {world_size}: {error}") from None
    try:
        written = atomic_write_json(out_path, config)
        hf_path = atomic_write_json(out_path.with_suffix(".hf.json"), hf_variant(config)) if hf else None
    except OSError as error:
        raise UserError(f"cannot write {out_path}: {error.strerror or error}") from None
    return written, hf_path
