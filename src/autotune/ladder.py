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
class Candidate:
    """One configuration to predict or try: a rung, a micro-batch per GPU, and gradient checkpointing."""

    rung: Rung
    micro_batch: int
    grad_checkpointing: bool = False

    @property
    def key(self) -> str:
        return f"{self.rung.value}/mb{self.micro_batch}/{'ckpt' if self.grad_checkpointing else 'nockpt'}"

    def describe(self) -> str:
        ckpt = ", grad checkpointing" if self.grad_checkpointing else ""
        return f"{self.rung.label}, micro-batch {self.micro_batch}{ckpt}"

    def to_dict(self) -> dict:
        return {"rung": self.rung.value, "micro_batch": self.micro_batch, "grad_checkpointing": self.grad_checkpointing}

    @classmethod
    def from_dict(cls, data: dict) -> Candidate:
        return cls(parse_rung(data["rung"]), int(data["micro_batch"]), bool(data["grad_checkpointing"]))
