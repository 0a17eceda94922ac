"""What each method hands back: its wall time, launches, the config it chose and what it explored."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field

from compare.environment import load_average


@dataclass(frozen=True)
class ChosenConfig:
    """A recommendation reduced to the knobs the methods share, plus the exact ds_config to re-measure."""

    stage: int
    micro_batch: int
    gradient_accumulation: int
    ds_config: dict
    grad_checkpointing: bool = False
    offload_optimizer: str | None = None
    offload_param: str | None = None

    @classmethod
    def from_ds_config(cls, ds_config: dict, grad_checkpointing: bool = False) -> ChosenConfig:
        """Read the knobs back out of the config itself, so all three methods are described the same way."""
        zero = ds_config.get("zero_optimization", {})
        return cls(
            stage=int(zero.get("stage", 0)),
            micro_batch=int(ds_config["train_micro_batch_size_per_gpu"]),
            gradient_accumulation=int(ds_config.get("gradient_accumulation_steps", 1)),
            ds_config=ds_config,
            grad_checkpointing=grad_checkpointing,
            offload_optimizer=(zero.get("offload_optimizer") or {}).get("device"),
            offload_param=(zero.get("offload_param") or {}).get("device"),
        )

    @property
    def label(self) -> str:
        parts = [f"ZeRO-{self.stage}", f"mb {self.micro_batch}", f"GAS {self.gradient_accumulation}"]
        if self.offload_optimizer:
            parts.append(f"opt->{self.offload_optimizer}")
        if self.offload_param:
            parts.append(f"param->{self.offload_param}")
        if self.grad_checkpointing:
            parts.append("ckpt")
        return ", ".join(parts)

    @property
    def key(self) -> str:
        """Identical configs are measured once and shared (DeepSpeed's differ: it keeps ZeRO defaults)."""
        return json.dumps({"ds_config": self.ds_config, "ckpt": self.grad_checkpointing}, sort_keys=True)

    def to_dict(self) -> dict:
        return {**asdict(self), "label": self.label}


@dataclass
class MethodRun:
    """One method's tuning run in one scenario, as it happened."""

    method: str  # "autotune" | "deepspeed_autotuning" | "exhaustive"
    scenario: str
    status: str  # "ok" | "failed" | "nothing_fits" | "skipped"
    wall_s: float | None = None  # start of the method to its recommendation, end to end
    launches: int | None = None  # trial processes started (each one a fresh launcher + worker)
    chosen: ChosenConfig | None = None
    reported_samples_per_s: float | None = None  # the method's own figure for its choice
    reported_by: str = ""  # what produced that figure
    explored: list[dict] = field(default_factory=list)
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    load_before: list[float] = field(default_factory=load_average)
    load_after: list[float] | None = None
    details: dict = field(default_factory=dict)

    def finish(self) -> MethodRun:
        self.load_after = load_average()
        return self

    def to_dict(self) -> dict:
        data = asdict(self)
        data["chosen"] = self.chosen.to_dict() if self.chosen else None
        return data


@dataclass
class Remeasured:
    """One config re-run with the fixed measurement: warm runs give its throughput, the cold run its peak."""

    key: str
    label: str
    runs: list[dict] = field(default_factory=list)  # kind, status, samples_per_s, peak_bytes, steps, wall_s, error

    def _ok(self, kind: str) -> list[dict]:
        return [run for run in self.runs if run["kind"] == kind and run["status"] == "ok" and run["samples_per_s"]]

    @property
    def speeds(self) -> list[float]:
        """Warm runs' samples/s (cold ones only if no warm run succeeded)."""
        return [run["samples_per_s"] for run in (self._ok("warm") or self._ok("cold"))]

    @property
    def samples_per_s(self) -> float | None:
        return statistics.median(self.speeds) if self.speeds else None

    @property
    def peak_bytes(self) -> int | None:
        """The cold run's peak: a fresh process, as a real training job starts."""
        values = [run["peak_bytes"] for run in (self._ok("cold") or self._ok("warm")) if run["peak_bytes"]]
        return int(statistics.median(values)) if values else None

    @property
    def spread(self) -> float | None:
        """(max - min) / median of samples/s across repeats: how far one figure can be trusted."""
        if len(self.speeds) < 2:
            return None
        return (max(self.speeds) - min(self.speeds)) / statistics.median(self.speeds)

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "samples_per_s_median": self.samples_per_s,
            "samples_per_s_min": min(self.speeds) if self.speeds else None,
            "samples_per_s_max": max(self.speeds) if self.speeds else None,
            "repeats_ok": len(self.speeds),
            "peak_bytes_median": self.peak_bytes,
            "spread": self.spread,
            "runs": self.runs,
        }
