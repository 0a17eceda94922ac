"""What the hook hands the job's training step: the two config files, the flags an HF Trainer script needs, the
world size the config is valid for, and the lines each rank runs (docs/cluster.md).

`--print-env` prints them as shell exports for `eval "$(autotune hook ... --print-env)"`; the names are an agreed
interface (examples/slurm, examples/torchrun and docs/cluster.md use them):
- AUTOTUNE_DS_CONFIG: the plain ds_config.json, for a script built with `deepspeed.add_config_arguments`
  (`--deepspeed_config "$AUTOTUNE_DS_CONFIG"`) or calling `deepspeed.initialize(config=...)`;
- AUTOTUNE_HF_CONFIG: the `.hf.json` beside it, for an HF Trainer script (`--deepspeed "$AUTOTUNE_HF_CONFIG"`):
  its "auto" optimizer values and clipping take the script's own TrainingArguments;
- AUTOTUNE_HF_ARGS: the TrainingArguments flags the `.hf.json`'s concrete values need (HF refuses a config whose
  batch or precision differs from TrainingArguments: transformers/integrations/deepspeed.py `fill_match`);
- AUTOTUNE_WORLD_SIZE: the ranks the config is valid for (DeepSpeed asserts train_batch_size == micro-batch x
  accumulation x world size, runtime/config.py `_batch_assertion`).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.core.ladder import Candidate
from autotune.dsconfig.launchers import TunedRun, hf_trainer_flags, world_size_line
from autotune.hook.outputs import published_report
from autotune.report.data import TuneReport

if TYPE_CHECKING:
    from autotune.hook.run import HookResult


@dataclass(frozen=True)
class Handoff:
    ds_config: Path
    hf_config: Path
    hf_args: str
    world_size: int
    gpus_per_node: int
    nodes: int

    def exports(self) -> list[str]:
        """One `export NAME=value` per line, every value shell-quoted."""
        values = {
            "AUTOTUNE_DS_CONFIG": str(self.ds_config),
            "AUTOTUNE_HF_CONFIG": str(self.hf_config),
            "AUTOTUNE_HF_ARGS": self.hf_args,
            "AUTOTUNE_WORLD_SIZE": str(self.world_size),
        }
        return [f"export {name}={shlex.quote(value)}" for name, value in values.items()]

    def world_line(self) -> str:
        return world_size_line(self.world_size, self.gpus_per_node, self.nodes)

    def rank_lines(self) -> list[str]:
        """What each rank runs, for both kinds of script (the examples' lines)."""
        return [
            f"HF Trainer script:  your_script.py --deepspeed {shlex.quote(str(self.hf_config))} {self.hf_args}",
            f"DeepSpeed script:   your_script.py --deepspeed --deepspeed_config {shlex.quote(str(self.ds_config))}"
            " (deepspeed.add_config_arguments)",
        ]


def hook_handoff(result: HookResult) -> Handoff:
    """The handoff of what this hook process wrote at its --out."""
    outputs = result.record.details.get("outputs") or {}
    candidate = Candidate.from_dict(outputs["candidate"]) if outputs.get("candidate") else None
    return handoff_of(
        result.config_path,
        config_of(result.record.config_text),
        published_report(outputs),
        candidate,
        gpus_per_node=result.job.gpus_per_node,
        nodes=result.job.nodes,
    )


def handoff_of(
    config_path: Path,
    config: dict[str, Any],
    report: TuneReport | None,
    candidate: Candidate | None,
    gpus_per_node: int,
    nodes: int,
) -> Handoff:
    """The handoff of a written config: its flags from the tuning's launch commands when the report has them, else
    read off the config itself (a fallback without a report)."""
    if report is not None and report.launch is not None and report.launch.hf_flags:
        flags = report.launch.hf_flags
    else:
        flags = hf_trainer_flags(_run_of(config_path, config, candidate))
    micro, steps = config.get("train_micro_batch_size_per_gpu"), config.get("gradient_accumulation_steps")
    batch = config.get("train_batch_size")
    whole = all(isinstance(v, int) and v > 0 for v in (micro, steps, batch))
    world = batch // (micro * steps) if whole else gpus_per_node * nodes  # type: ignore[operator]
    return Handoff(
        ds_config=config_path,
        hf_config=config_path.with_suffix(".hf.json"),
        hf_args=flags,
        world_size=world,
        gpus_per_node=gpus_per_node,
        nodes=nodes,
    )


def _run_of(config_path: Path, config: dict[str, Any], candidate: Candidate | None) -> TunedRun:
    precision = next((p for p in ("bf16", "fp16") if (config.get(p) or {}).get("enabled") is True), "fp32")
    zero = config.get("zero_optimization") or {}
    return TunedRun(
        config_path=config_path,
        hf_config_path=config_path.with_suffix(".hf.json"),
        accelerate_config_path=config_path.with_suffix(".accelerate.yaml"),
        micro_batch=int(config.get("train_micro_batch_size_per_gpu") or 1),
        accumulation=int(config.get("gradient_accumulation_steps") or 1),
        precision=precision,  # type: ignore[arg-type]
        grad_checkpointing=bool(candidate and candidate.grad_checkpointing),
        stage=int(zero.get("stage", 0)) if isinstance(zero, dict) else 0,
    )


def config_of(text: str | None) -> dict[str, Any]:
    try:
        loaded = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {}
    return loaded if isinstance(loaded, dict) else {}
