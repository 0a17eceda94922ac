"""What one benchmark run compares: the model, the grid both tuners can express, budgets and measurement."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from autotune.core.ladder import Rung, parse_rung

# DeepSpeed's autotuner cannot offload (issues 3379, 3478): the shared space is plain ZeRO stages 0-3.
SHARED_RUNGS: tuple[Rung, ...] = (Rung.Z0, Rung.Z1, Rung.Z2, Rung.Z3)


@dataclass(frozen=True)
class Measurement:
    """The fixed trial used to re-measure every chosen config the same way (same steps, same timer)."""

    warmup_steps: int = 3
    max_steps: int = 10
    repeats: int = 5  # warm runs per config (plus one cold run for the peak)


@dataclass(frozen=True)
class BenchSettings:
    model: str
    device: str  # "cpu" | "cuda"
    seq_len: int
    micro_batches: tuple[int, ...]  # every value divides the largest: DeepSpeed keeps the global batch fixed
    ranks: int = 1  # CPU processes or GPUs, one node
    precision: str = "bf16"
    headroom: float = 0.9
    memory_budget: str | None = None  # scenario 1, per rank; None: autotune's default (available RAM / GPU free)
    tight_budget: str | None = None  # scenario 2 ("auto": derived from the exhaustive grid's peaks)
    gpu_memory_fraction: float | None = None  # emulate a smaller card (cuda only)
    autotune_rungs: tuple[Rung, ...] = SHARED_RUNGS  # the GPU variant may give autotune the whole ladder
    max_trials: int = 12  # autotune's own default
    trial_timeout_s: float = 900.0
    ds_start_profile_step: int = 3  # DeepSpeed autotuner defaults
    ds_end_profile_step: int = 5
    ds_timeout_s: float = 1800.0
    measurement: Measurement = Measurement()
    launcher: str = "local"  # "local": a fresh worker process per trial (autotune's default); "warm": a pool
    threads: int | None = 1  # OMP/MKL threads per trial process, for all three methods; None: torch's default

    @property
    def global_batch(self) -> int:
        """DeepSpeed's autotuner fixes max micro-batch x GAS 1 per rank and derives GAS for smaller ones."""
        return max(self.micro_batches) * self.ranks

    @property
    def grid_size(self) -> int:
        return len(SHARED_RUNGS) * len(self.micro_batches)

    def check(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        largest = max(self.micro_batches)
        uneven = [m for m in self.micro_batches if largest % m]
        if uneven:
            raise ValueError(f"micro-batches {uneven} do not divide {largest}: the global batch would differ")
        if self.gpu_memory_fraction is not None and self.device != "cuda":
            raise ValueError("--gpu-memory-fraction needs --device cuda")

    def to_dict(self) -> dict:
        data = asdict(self)
        data["autotune_rungs"] = [r.value for r in self.autotune_rungs]
        data["shared_rungs"] = [r.value for r in SHARED_RUNGS]
        data["global_batch"] = self.global_batch
        return data


def parse_rungs(text: str) -> tuple[Rung, ...]:
    return tuple(parse_rung(part.strip()) for part in text.split(",") if part.strip())


def parse_ints(text: str) -> tuple[int, ...]:
    values = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    if not values or values[0] <= 0:
        raise ValueError(f"expected positive integers, got {text!r}")
    return values
