"""Shared by the two example training scripts: a model from a name, random data, LoRA, and a line
stating what the DeepSpeed engine actually runs with (read from the engine, not from any file)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch


def load_model(name: str) -> Any:
    """A randomly initialised model: a local HF model dir / config.json, or an autotune profile name."""
    import transformers

    path = Path(name)
    if path.exists():
        config = transformers.AutoConfig.from_pretrained(path.parent if path.is_file() else path)
        return transformers.AutoModelForCausalLM.from_config(config)
    from autotune.models import resolve_model
    from autotune.models.architecture import build_model

    source = resolve_model(name)
    model, _ = build_model(source.config, source.architecture, device="cpu")
    return model


def maybe_lora(model: Any, rank: int | None) -> Any:
    """LoRA adapters on peft's default target modules for this architecture (the tuner's default too)."""
    if not rank:
        return model
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank))


class RandomTokens(torch.utils.data.Dataset):
    """Causal-LM samples of random tokens: input ids are the labels (the model shifts them)."""

    def __init__(self, vocab: int, seq_len: int, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (count, seq_len), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def innermost_optimizer(optimizer: Any) -> str:
    """The optimizer class DeepSpeed ended up stepping, under its ZeRO / mixed-precision wrappers."""
    return type(innermost(optimizer)).__name__


def innermost(optimizer: Any) -> Any:
    seen = 0
    while hasattr(optimizer, "optimizer") and seen < 5:
        optimizer = optimizer.optimizer
        seen += 1
    return optimizer


def optimizer_values(optimizer: Any) -> dict:
    """The first param group's hyperparameters as the optimizer steps with them; the lr as set before any schedule
    (torch's LR schedulers keep it as "initial_lr")."""
    group = innermost(optimizer).param_groups[0]
    return {
        "lr": group.get("initial_lr", group.get("lr")),
        "betas": list(group["betas"]) if "betas" in group else None,
        "eps": group.get("eps"),
        "weight_decay": group.get("weight_decay"),
    }


def engine_facts(engine: Any, model: Any) -> dict:
    """What the engine trains with: batch arithmetic, precision, optimizer and its values, clipping, trainable
    parameters."""
    precision = "bf16" if engine.bfloat16_enabled() else "fp16" if engine.fp16_enabled() else "fp32"
    module = engine.module
    return {
        "micro_batch": engine.train_micro_batch_size_per_gpu(),
        "accumulation": engine.gradient_accumulation_steps(),
        "train_batch_size": engine.train_batch_size(),
        "world_size": engine.world_size,
        "precision": precision,
        "zero_stage": engine.zero_optimization_stage(),
        "param_dtype": str(next(module.parameters()).dtype).replace("torch.", ""),
        "optimizer": innermost_optimizer(engine.optimizer),
        "gradient_checkpointing": bool(getattr(model, "is_gradient_checkpointing", False)),
        "trainable_params": sum(getattr(p, "ds_numel", 0) or p.numel() for p in module.parameters() if p.requires_grad),
        "global_steps": engine.global_steps,
        "gradient_clipping": engine.gradient_clipping(),
        **optimizer_values(engine.optimizer),
    }


def report(facts: dict, path: str | None) -> None:
    """Rank 0 prints one `ENGINE {...}` line, and writes it to `path` when given."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    print("ENGINE " + json.dumps(facts), flush=True)
    if path:
        Path(path).write_text(json.dumps(facts))


def finish() -> None:
    """End the run as torch's docs ask: without it, gloo's worker threads can outlive the interpreter and abort
    a finished run's exit with "terminate called without an active exception" (SIGABRT, pytorch/pytorch#190489)."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
