"""The modern memory modes (beyond the classic ladder), as the search sees them.

Which mode applies to which rung, node count and hardware is `autotune.modes.applies`'s decision; the search takes
that list through an injected callable (`ModesFor`) and only needs four fields of each entry (`ModeChoice`).
Here: the shapes the search reports, and the pure pieces of the offload-ratio knob (its bisection).

The offload ratio (`zero_optimization.offload_optimizer.ratio`) is not continuous in DeepSpeed 0.19.8: stage 3
puts sub-group i on the CPU iff i >= int((1 - ratio) * sub_groups) (deepspeed/runtime/zero/stage3.py:1103-1108),
so only as many distinct settings exist as there are sub-groups per rank. The search bisects over the real
settings it is given (`Search.offload_ratios`), never over a finer grid that DeepSpeed would collapse.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from autotune.core.ladder import Mode, Rung


class ModeChoice(Protocol):
    """What the search reads of one `autotune.modes.applies.ModeOption`: the mode, whether it applies on the rung here,
    why (or why not), and whether a trial on this backend can run it."""

    @property
    def mode(self) -> Mode: ...

    @property
    def applies(self) -> bool: ...

    @property
    def reason(self) -> str: ...

    @property
    def trial_verifiable(self) -> bool: ...


ModesFor = Callable[[Rung], Sequence[ModeChoice]]


def no_modes(rung: Rung) -> Sequence[ModeChoice]:
    """The classic ladder only (what the search did before the modern memory modes)."""
    return ()


def is_ratio_mode(mode: Mode) -> bool:
    """A partial-offload setting and nothing else: the knob the search bisects."""
    return mode.offload_ratio != 1.0 and Mode(offload_ratio=mode.offload_ratio) == mode


def smallest_fitting_ratio(ratios: Sequence[float], fits: Callable[[float], bool]) -> float | None:
    """Smallest ratio in `ratios` (ascending) for which `fits` holds; None when even the largest does not.

    Bisection, so it asks `fits` about log2(len) ratios: GPU memory falls as the ratio rises (each step moves
    whole sub-groups of fp32 master weights, momentum, variance and gradients to the host; stage3.py:1103-1108,
    1150-1160), so `fits` is monotone over the list.
    """
    low, high = 0, len(ratios) - 1
    if high < 0 or not fits(ratios[high]):
        return None
    while low < high:
        middle = (low + high) // 2
        if fits(ratios[middle]):
            high = middle
        else:
            low = middle + 1
    return ratios[low]


@dataclass
class ModeRecord:
    """What the search did with one mode on one rung (over both checkpointing settings): the report's row."""

    rung: Rung
    mode: Mode
    applies: bool
    reason: str  # autotune.modes.applies' reason: why it applies, or why not
    trial_verifiable: bool
    status: str = "not applicable"  # see STATUSES
    detail: str = ""  # the search's own words: why not tried, which ratio fitted, ...
    predicted_peak_bytes: int | None = None  # at `micro_batch`, with the memory model's calibration then
    micro_batch: int | None = None
    grad_checkpointing: bool | None = None
    samples_per_s: float | None = None  # best measured of this mode on this rung
    trials: int = 0  # trials launched for it (cached replays not counted)

    @property
    def label(self) -> str:
        """The mode in words; an offload ratio only once the search settled on one (measured or planned)."""
        if is_ratio_mode(self.mode) and self.status not in ("measured", "planned"):
            return "partial offload (offload ratio searched)"
        return self.mode.label or "classic"

    def to_dict(self) -> dict:
        return {
            "rung": self.rung.value,
            "mode": self.mode.to_dict(),
            "label": self.label,
            "applies": self.applies,
            "reason": self.reason,
            "trial_verifiable": self.trial_verifiable,
            "status": self.status,
            "detail": self.detail,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "micro_batch": self.micro_batch,
            "grad_checkpointing": self.grad_checkpointing,
            "samples_per_s": self.samples_per_s,
            "trials": self.trials,
        }


STATUSES = {
    "not applicable": "autotune.modes.applies says it does not apply here",
    "planned": "applies, but no trial on this backend can run it: predicted only, never picked over a measured config",
    "measured": "tried for real; its best measured speed is compared with the classic rungs",
    "no fit": "tried or predicted, and nothing of it fitted",
    "not tried": "applies, but the budget or a measured bound left it untried",
}
