"""The escalation ladder: ZeRO stage and offload choices, fastest first, plus the per-rung knobs."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Rung(str, Enum):
    """One rung of the documented escalation ladder, in expected-speed order."""

    Z0 = "z0"
    Z1 = "z1"
    Z2 = "z2"
    Z2_OFFLOAD_OPT = "z2+offload_opt"
    Z3 = "z3"
    Z3_OFFLOAD_OPT = "z3+offload_opt"
    Z3_OFFLOAD_ALL = "z3+offload_opt+param"
    Z3_NVME_OPT = "z3+nvme_opt"
    Z3_NVME_ALL = "z3+nvme_opt+param"

    @property
    def stage(self) -> int:
        return {"z0": 0, "z1": 1, "z2": 2}.get(self.value.split("+")[0], 3)

    @property
    def offload_optimizer(self) -> str | None:
        """'cpu', 'nvme' or None."""
        if "nvme_opt" in self.value:
            return "nvme"
        return "cpu" if "offload_opt" in self.value else None

    @property
    def offload_param(self) -> str | None:
        if self is Rung.Z3_NVME_ALL:
            return "nvme"
        return "cpu" if self in (Rung.Z3_OFFLOAD_ALL, Rung.Z3_NVME_OPT) else None

    @property
    def needs_nvme(self) -> bool:
        return "nvme" in self.value

    @property
    def order(self) -> int:
        return list(Rung).index(self)

    @property
    def label(self) -> str:
        parts = [f"ZeRO-{self.stage}"]
        if self.offload_optimizer:
            parts.append(f"optimizer->{self.offload_optimizer}")
        if self.offload_param:
            parts.append(f"params->{self.offload_param}")
        return " + ".join(parts)


LADDER: tuple[Rung, ...] = tuple(Rung)


def parse_rung(text: str) -> Rung:
    for rung in Rung:
        if text in (rung.value, rung.name.lower()):
            return rung
    raise ValueError(f"unknown rung {text!r}; known: {', '.join(r.value for r in Rung)}")


@dataclass(frozen=True, order=True)
class Mode:
    """Memory modes beyond the classic ladder that DeepSpeed 0.19.8 offers on some rungs: the modern memory modes.

    The default value is the classic rung, so a Candidate without a mode means exactly what it meant before, and its
    key and dict are unchanged (cache entries written before modes existed stay valid). Which mode applies to which
    rung, node count and hardware is decided in `autotune.modes.applies`, not here; this is only the value.
    """

    # zero_optimization.offload_optimizer.ratio: fraction of optimizer states offloaded (stage 3 + cpu offload only;
    # deepspeed/runtime/zero/offload_config.py `ratio`, runtime/zero/stage3.py `partial_offload`). 1.0 = classic.
    offload_ratio: float = 1.0
    # zero_optimization.zenflow: stages 1-2 with optimizer offload (deepspeed/runtime/zenflow/).
    zenflow: bool = False
    # ZeRO++ (stage 3): zero_hpz_partition_size (1 = off), zero_quantized_weights, zero_quantized_gradients.
    hpz_partition_size: int = 1
    quantized_weights: bool = False
    quantized_gradients: bool = False
    # offload_optimizer.super_offload: stage 3 offload for superchips (GH200-class).
    super_offload: bool = False

    @property
    def is_classic(self) -> bool:
        return self == Mode()

    @property
    def parts(self) -> list[str]:
        """Short names of what differs from the classic rung, in a fixed order (keys and labels use them)."""
        parts = []
        if self.offload_ratio != 1.0:
            parts.append(f"ratio{self.offload_ratio:g}")
        if self.zenflow:
            parts.append("zenflow")
        if self.hpz_partition_size != 1:
            parts.append(f"hpz{self.hpz_partition_size}")
        if self.quantized_weights:
            parts.append("qw")
        if self.quantized_gradients:
            parts.append("qg")
        if self.super_offload:
            parts.append("superoffload")
        return parts

    @property
    def label(self) -> str:
        words = {
            "zenflow": "ZenFlow",
            "qw": "quantized weights",
            "qg": "quantized gradients",
            "superoffload": "SuperOffload",
        }
        out = []
        for part in self.parts:
            if part.startswith("ratio"):
                out.append(f"offload ratio {self.offload_ratio:g}")
            elif part.startswith("hpz"):
                out.append(f"hpZ partition {self.hpz_partition_size}")
            else:
                out.append(words[part])
        return ", ".join(out)

    def to_dict(self) -> dict:
        return {
            "offload_ratio": self.offload_ratio,
            "zenflow": self.zenflow,
            "hpz_partition_size": self.hpz_partition_size,
            "quantized_weights": self.quantized_weights,
            "quantized_gradients": self.quantized_gradients,
            "super_offload": self.super_offload,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Mode:
        return cls(
            offload_ratio=float(data.get("offload_ratio", 1.0)),
            zenflow=bool(data.get("zenflow", False)),
            hpz_partition_size=int(data.get("hpz_partition_size", 1)),
            quantized_weights=bool(data.get("quantized_weights", False)),
            quantized_gradients=bool(data.get("quantized_gradients", False)),
            super_offload=bool(data.get("super_offload", False)),
        )


@dataclass(frozen=True, order=True)
class Candidate:
    """One configuration to predict or try: a rung, a micro-batch per GPU, gradient checkpointing, and a mode."""

    rung: Rung
    micro_batch: int
    grad_checkpointing: bool = False
    mode: Mode = Mode()

    @property
    def key(self) -> str:
        base = f"{self.rung.value}/mb{self.micro_batch}/{'ckpt' if self.grad_checkpointing else 'nockpt'}"
        return base if self.mode.is_classic else f"{base}/{'+'.join(self.mode.parts)}"

    def describe(self) -> str:
        ckpt = ", grad checkpointing" if self.grad_checkpointing else ""
        mode = "" if self.mode.is_classic else f" ({self.mode.label})"
        return f"{self.rung.label}{mode}, micro-batch {self.micro_batch}{ckpt}"

    def to_dict(self) -> dict:
        data: dict = {
            "rung": self.rung.value,
            "micro_batch": self.micro_batch,
            "grad_checkpointing": self.grad_checkpointing,
        }
        if not self.mode.is_classic:
            data["mode"] = self.mode.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Candidate:
        mode = Mode.from_dict(data["mode"]) if data.get("mode") else Mode()
        return cls(parse_rung(data["rung"]), int(data["micro_batch"]), bool(data["grad_checkpointing"]), mode)
