"""The global batch: the one tuned value that changes the user's training, so it is always stated.

Three ways it is decided, and the report says which:
- `--global-batch B`: the user's; micro-batch x accumulation x world size = B.
- `--tokens-per-step T`: B = T / seq_len, rounded to the nearest multiple of the world size (at least one
  sample per rank), then as above.
- neither: autotune's choice, gradient accumulation 1 and the fastest micro-batch that fits, so
  B = micro-batch x world size. It is the largest batch the memory allows without accumulation, which is
  rarely what a recipe tuned elsewhere used; the report and the CLI say so and how to pin it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from autotune.errors import UserError


@dataclass(frozen=True)
class GlobalBatch:
    global_batch: int
    micro_batch: int
    accumulation: int
    world_size: int
    seq_len: int
    chosen_by: str  # "user" | "tokens_per_step" | "autotune"
    how: str  # one sentence: how it was decided

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def pin_hint(self) -> str:
        return f"--global-batch {self.global_batch}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens_per_step": self.tokens_per_step, "pin": self.pin_hint}


def global_batch_for_tokens(tokens_per_step: int, seq_len: int, world_size: int) -> int:
    """Samples per step nearest to `tokens_per_step` that every rank can share equally."""
    if tokens_per_step <= 0:
        raise UserError(f"--tokens-per-step must be positive, got {tokens_per_step}")
    samples = tokens_per_step / seq_len
    return max(world_size, round(samples / world_size) * world_size)


def requested_global_batch(
    global_batch: int | None, tokens_per_step: int | None, seq_len: int, world_size: int
) -> int | None:
    """The global batch the search must keep, or None when autotune may choose it."""
    if tokens_per_step is None:
        return global_batch
    if global_batch is not None:
        raise UserError("give --global-batch or --tokens-per-step, not both")
    return global_batch_for_tokens(tokens_per_step, seq_len, world_size)


def describe_global_batch(
    config: dict, seq_len: int, pinned_by: str | None, tokens_per_step: int | None
) -> GlobalBatch:
    """Read the batch off the emitted config and say who decided it."""
    micro = int(config["train_micro_batch_size_per_gpu"])
    accumulation = int(config["gradient_accumulation_steps"])
    total = int(config["train_batch_size"])
    world = total // (micro * accumulation)
    if pinned_by == "user":
        how = "as you asked (--global-batch)."
    elif pinned_by == "tokens_per_step":
        how = f"from --tokens-per-step {tokens_per_step} / seq len {seq_len}, rounded to a multiple of the world size."
    else:
        how = (
            "chosen by autotune (no --global-batch): accumulation 1 and the fastest micro-batch that fits. This"
            f" sets your optimization batch; pin it with --global-batch {total} or choose yours."
        )
    return GlobalBatch(total, micro, accumulation, world, seq_len=seq_len, chosen_by=pinned_by or "autotune", how=how)
