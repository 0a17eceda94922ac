"""A measured step time with its spread, and how many steps make one: pure arithmetic, no torch import.

Every figure the tuner decides on is the median wall clock of whole optimizer steps. Its spread is the
distribution-free confidence interval of that median from order statistics (the interval between the k-th
smallest and k-th largest step, k from the binomial distribution of how many steps fall below the true
median; Conover, Practical Nonparametric Statistics, 3rd ed., section 3.2): no normality assumed, no random
resampling, so the same steps always give the same interval. The interquartile range of the steps is kept
beside it to describe how much single steps vary.

How many steps: at least MIN_STEPS, then until the interval's half-width is within TARGET_HALF_WIDTH of the
median, at most the cap the trial sets (steps, and seconds of measuring: slow steps stop there after
MIN_SLOW_STEPS). A quiet machine stops at MIN_STEPS;
a loaded one measures longer, and the report says how many steps each figure is from.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95  # the median's interval covers the true median with at least this probability
# Five steps give the first interval with any confidence at all: [min, max] covers the median with
# 1 - 2 * 0.5**5 = 93.75%; four steps give 87.5%.
MIN_STEPS = 5
# Half-width of the median's interval, relative to the median, at which measuring stops. 3%: two figures each known
# to +-3% separate configs more than 6% apart; the close calls that motivated this rule (picks on 1.5% and 4.5%
# margins) come out as ties. A target, not a promise: on the shared 2-core machine at load ~18 the own-script
# agreement benchmark's trials ran to their step cap without reaching it (benchmarks/README.md); wider intervals
# then make more ties, not surer picks.
TARGET_HALF_WIDTH = 0.03
MAX_STEPS = 20  # cap on measured steps per trial (a loaded machine never reaches the target)
MAX_MEASURE_S = 60.0  # cap on seconds of measured steps per trial, once MIN_SLOW_STEPS are in
# Slow steps stop at the time cap after three: on the shared 2-core machine at load ~15-19 a README demo did not
# finish in 25 minutes (benchmarks/README.md, pick stability); the trial it was in ran ZeRO-0 at micro-batch 99 with
# checkpointing, about twelve times the micro-batch-8 step's work. Three steps give the median's interval [min, max]
# at 75% coverage: wider, so more ties, never a surer pick.
MIN_SLOW_STEPS = 3


def _binomial_cdf(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


def median_rank_bound(n: int, confidence: float = CONFIDENCE) -> int:
    """The 1-based rank k such that [x(k), x(n-k+1)] is the narrowest order-statistics interval for the
    median with coverage >= confidence; 1 (min..max) when even that falls short."""
    alpha = (1 - confidence) / 2
    k = 1
    while k + 1 <= n // 2 and _binomial_cdf(k, n) <= alpha:
        k += 1
    return k


@dataclass(frozen=True)
class StepStats:
    """The median of whole optimizer steps, the median's interval and the steps' quartiles, in seconds."""

    steps: int
    median_s: float
    low_s: float  # the median's confidence interval
    high_s: float
    q1_s: float
    q3_s: float

    @classmethod
    def of(cls, step_times_s: Sequence[float]) -> StepStats | None:
        times = sorted(t for t in step_times_s if t > 0)
        if not times:
            return None
        n = len(times)
        k = median_rank_bound(n)
        if n >= 2:
            q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
        else:
            q1 = q3 = times[0]
        return cls(n, statistics.median(times), times[k - 1], times[n - k], q1, q3)

    @property
    def half_width(self) -> float:
        """Half the median's interval, relative to the median: the +- the report prints."""
        return (self.high_s - self.low_s) / 2 / self.median_s

    @property
    def iqr(self) -> float:
        """Interquartile range of single steps, relative to the median."""
        return (self.q3_s - self.q1_s) / self.median_s

    def to_dict(self) -> dict:
        return {
            "steps": self.steps,
            "median_s": self.median_s,
            "interval_s": [self.low_s, self.high_s],
            "confidence": CONFIDENCE,
            "iqr_s": [self.q1_s, self.q3_s],
        }


def enough_steps(
    step_times_s: Sequence[float],
    max_steps: int = MAX_STEPS,
    max_seconds: float = MAX_MEASURE_S,
    min_steps: int = MIN_STEPS,
    target: float = TARGET_HALF_WIDTH,
) -> bool:
    """Whether measuring may stop: the median is known to `target`, or a cap is reached."""
    n = len(step_times_s)
    if n >= max_steps:
        return True
    if n >= min(MIN_SLOW_STEPS, min_steps) and sum(step_times_s) >= max_seconds:
        return True
    if n < min_steps:
        return False
    stats = StepStats.of(step_times_s)
    return stats is not None and stats.half_width <= target


def steps_until_enough(
    step_times_s: Sequence[float],
    max_steps: int = MAX_STEPS,
    max_seconds: float = MAX_MEASURE_S,
    min_steps: int = MIN_STEPS,
) -> list[float]:
    """The steps a measurement stops at: the shortest prefix `enough_steps` accepts, or all of them.

    A process timed from outside (an own command, read between polls) runs on past the stopping point; its
    extra steps are dropped so the figure follows the same rule, and the same cap, as a trial that stops itself.
    """
    for n in range(1, len(step_times_s) + 1):
        if enough_steps(step_times_s[:n], max_steps, max_seconds, min_steps):
            return list(step_times_s[:n])
    return list(step_times_s)


@dataclass(frozen=True)
class Speed:
    """Samples per second of one candidate: the median step's rate and the interval the median's gives."""

    samples_per_step: float
    stats: StepStats

    @property
    def median(self) -> float:
        return self.samples_per_step / self.stats.median_s

    @property
    def low(self) -> float:
        return self.samples_per_step / self.stats.high_s

    @property
    def high(self) -> float:
        return self.samples_per_step / self.stats.low_s

    def beats(self, other: Speed) -> bool:
        """Faster beyond noise: this one's interval lies wholly above the other's."""
        return self.low > other.high

    def describe(self) -> str:
        """'4.86 samples/s (4.71-5.02, 12 steps)'."""
        return f"{self.median:.2f} samples/s ({self.low:.2f}-{self.high:.2f}, {self.stats.steps} steps)"

    def to_dict(self) -> dict:
        return {"samples_per_s": self.median, "interval": [self.low, self.high], **self.stats.to_dict()}


def speed_of(step_times_s: Sequence[float], samples_per_s: float | None) -> Speed | None:
    """A trial's speed with its spread, from its whole-step times and its median rate (which fixes the samples
    per step: train_batch_size for synthetic trials, the job's own batch for own-command ones)."""
    stats = StepStats.of(step_times_s)
    if stats is None or not samples_per_s:
        return None
    return Speed(samples_per_s * stats.median_s, stats)


def pooled(speeds: Sequence[tuple[Sequence[float], float | None]]) -> Speed | None:
    """One speed from several trials of the same candidate: their steps pooled, the samples per step of the
    first (the same candidate has the same batch)."""
    steps = [t for times, _ in speeds for t in times]
    first = next((speed for times, rate in speeds if (speed := speed_of(times, rate)) is not None), None)
    stats = StepStats.of(steps)
    if first is None or stats is None:
        return None
    return Speed(first.samples_per_step, stats)
