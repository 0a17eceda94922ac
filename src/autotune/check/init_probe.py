"""--init-check: build the DeepSpeed engine the way the config's consumer does, and run one training step, on the CPU.

A tiny model (two linear layers) is trained one step on DeepSpeed's CPU backend at world size 1, in a
subprocess (DeepSpeed initialises torch.distributed and may build ops: none of that may touch the
caller's process). The engine comes from where the consumer gets it: `deepspeed.initialize` for code calling
DeepSpeed directly; accelerate's `Accelerator(deepspeed_plugin=...).prepare(model, optimizer[, scheduler])` for
accelerate scripts and for the HF Trainer, whose optimizer and scheduler come from transformers'
`deepspeed_optim_sched` with the Trainer's default optimizer and schedule (TrainingArguments' defaults). That
path is where accelerate swaps a torch optimizer for DeepSpeedCPUAdam under optimizer offload.
The batch keys are scaled to world size 1 (the micro-batch and accumulation are kept, train_batch_size becomes
their product); everything else is the config as DeepSpeed receives it.
What this cannot show, it says: a GPU-only op (FusedAdam is replaced by DeepSpeed's CPU path on this
backend), fp16 where the CPU backend has none, NVMe offload without libaio.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from autotune.check.rules import resolve_batch, stated_batch
from autotune.check.values import batch_keys
from autotune.dsconfig.consumer import PLACEHOLDER_TRAINING_STEPS, accelerate_mixed_precision
from autotune.dsconfig.loading import section_of
from autotune.trial.launch.processes import one_rank_env

# Failures that say the CPU backend lacks something a GPU has, not that the config is wrong.
_BACKEND_LIMITS = (
    "not supported on your device",
    "not been implemented on CPU",
    "CUDA",
    "cuda",
    "NCCL",
    "nccl",
    "Triton",
    "triton",
)
DEFAULT_TIMEOUT_S = 300.0  # a first run may JIT-build DeepSpeed's CPU Adam (minutes on 2 cores)


@dataclass(frozen=True)
class InitOutcome:
    status: str  # "ok" | "failed" | "inconclusive"
    stage: str  # where it stopped: "initialize" | "step" | ""
    detail: str  # DeepSpeed's error line, or why the check could not tell


def scaled_to_one_rank(config: dict[str, Any], world_size: int) -> dict[str, Any]:
    """The config with its batch keys for world size 1: micro-batch and accumulation as at `world_size`."""
    scaled = json.loads(json.dumps(config, default=str))
    given = stated_batch(config)
    if given is not None:
        _, micro, steps, problem = resolve_batch(*given, world_size)
        if not problem and micro and steps:
            tbs_key, micro_key, gas_key = batch_keys()
            scaled.update({tbs_key: micro * steps, micro_key: micro, gas_key: steps})
    if scaled.get("steps_per_print") == float("inf") or scaled.get("steps_per_print") == "Infinity":
        scaled["steps_per_print"] = 10**9  # accelerate's inf, which JSON cannot carry
    return scaled


def run_init_check(
    config: dict[str, Any], world_size: int, consumer: str = "deepspeed", timeout_s: float = DEFAULT_TIMEOUT_S
) -> InitOutcome:
    """Initialise and step a tiny model with `config` (as filled for `consumer`, a Consumer value) in a subprocess,
    the way `consumer` builds its engine; never raises for DeepSpeed's errors."""
    scaled = scaled_to_one_rank(config, world_size)
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        **one_rank_env(),
    }
    try:
        done = subprocess.run(
            [sys.executable, "-m", "autotune.check.init_probe"],
            input=json.dumps({"config": scaled, "consumer": consumer}),
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return InitOutcome("inconclusive", "", f"no answer within {timeout_s:.0f} s (an op build may still be running)")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return InitOutcome("inconclusive", "", f"the probe exited with code {done.returncode}: {tail}")
    result = json.loads(lines[-1])
    return InitOutcome(result["status"], result["stage"], result["detail"])


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".strip()


def _limits(config: dict[str, Any]) -> str:
    """Why the CPU backend cannot answer for this config, or ""."""
    zero = section_of(config, "zero_optimization")
    for section in ("offload_optimizer", "offload_param"):
        value = zero.get(section)
        if isinstance(value, dict) and value.get("device") == "nvme":
            return "NVMe offload needs libaio and a scratch path; not run"
    return ""


class _TrainerStandIn:
    """What transformers' deepspeed_optim_sched asks of the Trainer: its optimizer and scheduler as the Trainer
    builds them from TrainingArguments (Trainer.get_optimizer_cls_and_kwargs; create_scheduler's get_scheduler)."""

    def __init__(self, args: Any, parameters: list[Any]) -> None:
        self.args = args
        self.parameters = parameters
        self.lr_scheduler = None

    def create_optimizer(self) -> Any:
        from transformers import Trainer

        optimizer_class, kwargs = Trainer.get_optimizer_cls_and_kwargs(self.args)
        return optimizer_class(self.parameters, **kwargs)

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        from transformers import get_scheduler

        return get_scheduler(
            self.args.lr_scheduler_type,
            optimizer=optimizer,
            num_warmup_steps=self.args.get_warmup_steps(num_training_steps),
            num_training_steps=num_training_steps,
            scheduler_specific_kwargs=self.args.lr_scheduler_kwargs,
        )


def _trainer_arguments() -> Any:
    from transformers import TrainingArguments

    return TrainingArguments(report_to=[])  # the Trainer's defaults; nothing is written to its output_dir


def _prepared_by_accelerate(config: dict[str, Any], consumer: str, model: Any) -> Any:
    """The engine accelerate's prepare() builds, given what the HF Trainer or an accelerate script hands it."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin, DummyOptim, DummyScheduler

    parameters = [p for p in model.parameters() if p.requires_grad]
    # TrainingArguments first: building it resets accelerate's shared state, which the Accelerator then sets.
    args = _trainer_arguments() if consumer == "hf-trainer" else None
    plugin = DeepSpeedPlugin(hf_ds_config=config)
    accelerator = Accelerator(deepspeed_plugin=plugin, mixed_precision=accelerate_mixed_precision(config))
    if args is not None:
        from transformers.integrations.deepspeed import deepspeed_optim_sched

        trainer = _TrainerStandIn(args, parameters)
        steps = PLACEHOLDER_TRAINING_STEPS
        optimizer, scheduler = deepspeed_optim_sched(trainer, plugin.hf_ds_config, args, steps, parameters)
    else:  # an accelerate script: DummyOptim/DummyScheduler where the config has the section (accelerate demands it)
        optimizer = DummyOptim(parameters) if "optimizer" in config else torch.optim.AdamW(parameters, lr=1e-4)
        scheduler = DummyScheduler(optimizer) if "scheduler" in config else None
    objects = (model, optimizer) if scheduler is None else (model, optimizer, scheduler)
    return accelerator.prepare(*objects)[0]


def _engine(config: dict[str, Any], consumer: str, model: Any) -> Any:
    if consumer != "deepspeed":
        return _prepared_by_accelerate(config, consumer, model)
    import deepspeed
    import torch

    # No optimizer section: the training code brings its own (Megatron, a plain script); so does this probe.
    client = None if "optimizer" in config else torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), optimizer=client, config=config)
    return engine


def _probe(config: dict[str, Any], consumer: str = "deepspeed") -> dict[str, str]:
    limit = _limits(config)
    if limit:
        return {"status": "inconclusive", "stage": "", "detail": limit}
    import torch
    from deepspeed.accelerator import get_accelerator

    note = ""
    fp16 = config.get("fp16")
    bf16 = config.get("bf16")
    both = isinstance(bf16, dict) and bf16.get("enabled") is True  # DeepSpeed refuses that; let it say so
    if (
        isinstance(fp16, dict)
        and fp16.get("enabled") is True
        and not both
        and not get_accelerator().is_fp16_supported()
    ):
        config = {**config, "fp16": {"enabled": False}, "bf16": {"enabled": True}}
        note = " (fp16 run as bf16: the CPU backend has no fp16)"
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    stage = "initialize"
    try:
        engine = _engine(config, consumer, model)
        stage = "step"
        dtype = next(engine.module.parameters()).dtype
        for _ in range(engine.gradient_accumulation_steps()):
            inputs = torch.randn(engine.train_micro_batch_size_per_gpu(), 16, dtype=dtype)
            loss = engine(inputs).float().pow(2).mean()
            engine.backward(loss)
            engine.step()
    except Exception as error:  # the point is to report DeepSpeed's refusal, whatever it is
        detail = _first_line(error)
        if any(word in detail for word in _BACKEND_LIMITS):
            return {"status": "inconclusive", "stage": stage, "detail": f"the CPU backend cannot run it: {detail}"}
        return {"status": "failed", "stage": stage, "detail": detail + note}
    built = "deepspeed.initialize" if consumer == "deepspeed" else "accelerate's prepare()"
    optimizer = type(getattr(engine, "basic_optimizer", None) or engine.optimizer).__name__
    done = f"{built} ({optimizer}) and one optimizer step succeeded on the CPU backend at world size 1"
    return {"status": "ok", "stage": "", "detail": done + note}


def main() -> None:
    request = json.loads(sys.stdin.read())
    result = _probe(request["config"], request["consumer"])
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip DeepSpeed/torch.distributed teardown, which can hang without a destroy


if __name__ == "__main__":
    main()
