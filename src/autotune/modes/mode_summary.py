"""The modern memory modes in a plan-only answer: what `autotune plan` prints after its recommendation, and
what a "nothing fits" message adds when a mode is predicted to fit where no classic rung does.

Built from the search's `ModeRecord`s (`search.for_context.planned_modes`, or a search's outcome), never from its own
estimates, so plan, plan-only tune and the report say the same thing. A mode here is a prediction only: it is
never recommended over the classic pick (no trial measured its speed, and the speed priors know no mode).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.core.ladder import Mode
from autotune.core.units import format_bytes
from autotune.modes.search_view import ModeRecord

NOT_VERIFIED = "not trial-verified: worth a trial on the target"


@dataclass(frozen=True)
class PredictedMode:
    """One applicable mode on one rung, with what the memory model predicts for it."""

    rung: str
    rung_label: str
    mode: str  # the mode in words (the settled offload ratio for partial offload)
    fits: bool
    micro_batch: int | None
    grad_checkpointing: bool | None
    predicted_peak_bytes: int | None
    trial_verifiable: bool  # whether a trial on this backend could run it (False for every plan-only record)

    def line(self) -> str:
        if not self.fits:
            return f"{self.rung}: {self.mode}: predicted not to fit at any micro-batch"
        ckpt = "on" if self.grad_checkpointing else "off"
        peak = format_bytes(self.predicted_peak_bytes) if self.predicted_peak_bytes is not None else "?"
        return (
            f"{self.rung}: {self.mode} fits at micro-batch {self.micro_batch}, checkpointing {ckpt},"
            f" predicted peak {peak} per GPU"
        )

    def to_dict(self) -> dict:
        return {
            "rung": self.rung,
            "mode": self.mode,
            "fits": self.fits,
            "micro_batch": self.micro_batch,
            "grad_checkpointing": self.grad_checkpointing,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "trial_verifiable": self.trial_verifiable,
        }


@dataclass(frozen=True)
class NotApplicable:
    """Modes that do not apply, grouped by their reason: one line each."""

    reason: str
    modes: tuple[str, ...]
    rungs: tuple[str, ...]

    def line(self) -> str:
        return f"{', '.join(self.modes)} (on {', '.join(self.rungs)}): {self.reason}"

    def to_dict(self) -> dict:
        return {"reason": self.reason, "modes": list(self.modes), "rungs": list(self.rungs)}


def _unique(items: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _predicted(record: ModeRecord) -> PredictedMode:
    fits = record.status in ("planned", "measured") and record.micro_batch is not None
    return PredictedMode(
        record.rung.value,
        record.rung.label,
        record.label,
        fits,
        micro_batch=record.micro_batch,
        grad_checkpointing=record.grad_checkpointing,
        predicted_peak_bytes=record.predicted_peak_bytes,
        trial_verifiable=record.trial_verifiable,
    )


def family_name(mode: Mode) -> str:
    """The mode's family in words: a not-applicable line names the family, not one representative setting."""
    if mode.offload_ratio != 1.0:
        return "partial offload"
    if mode.zenflow:
        return "ZenFlow"
    if mode.super_offload:
        return "SuperOffload"
    return "ZeRO++"


@dataclass(frozen=True)
class ModeSummary:
    predicted: tuple[PredictedMode, ...]
    not_applicable: tuple[NotApplicable, ...]

    @classmethod
    def from_records(cls, records: Sequence[ModeRecord]) -> ModeSummary:
        predicted = tuple(_predicted(r) for r in records if r.applies)
        reasons: dict[str, list[ModeRecord]] = {}
        for record in (r for r in records if not r.applies):
            reasons.setdefault(record.reason, []).append(record)
        not_applicable = tuple(
            NotApplicable(reason, _unique([family_name(r.mode) for r in group]), _unique([r.rung.value for r in group]))
            for reason, group in reasons.items()
        )
        return cls(predicted, not_applicable)

    @property
    def fitting(self) -> tuple[PredictedMode, ...]:
        return tuple(p for p in self.predicted if p.fits)

    def lines(self, picked: bool = True) -> list[str]:
        """The plan's section: applicable modes with their prediction, then one line per reason a mode does not
        apply. Empty when no mode was considered. `picked`: a classic pick was printed above."""
        if not self.predicted and not self.not_applicable:
            return []
        lines = []
        if self.predicted:
            never = "; never recommended over the pick above" if picked else ""
            lines.append(f"Modern modes, predicted ({NOT_VERIFIED}{never}):")
            lines += [f"  {p.line()}" for p in self.predicted]
        if self.not_applicable:
            lines.append("Modes that do not apply:")
            lines += [f"  {n.line()}" for n in self.not_applicable]
        return lines

    def nothing_fits_hint(self) -> str:
        """When no classic rung fits: the first mode predicted to fit, said as a prediction; "" when none does."""
        if not self.fitting:
            return ""
        first = self.fitting[0]
        ckpt = " with checkpointing" if first.grad_checkpointing else ""
        return (
            f"{first.rung_label} at {first.mode} is predicted to fit at micro-batch {first.micro_batch}"
            f"{ckpt} (not trial-verified here)"
        )

    def to_dict(self) -> dict:
        return {
            "note": NOT_VERIFIED,
            "predicted": [p.to_dict() for p in self.predicted],
            "not_applicable": [n.to_dict() for n in self.not_applicable],
        }
