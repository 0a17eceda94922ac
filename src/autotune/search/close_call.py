"""The pick among measured candidates: faster only beyond noise, else the simpler, safer config.

A candidate wins only when its speed interval lies wholly above every other's (measurement.Speed.beats).
Otherwise the candidates whose intervals reach the fastest one's are a tie within noise, and the pick is the
simplest of them: no host offload first (it needs host RAM and pinned memory the job may not have), then the
earlier rung of the ladder (fewer moving parts), then no gradient checkpointing, then the classic rung over a
mode. A tie is first re-measured interleaved, the simplest and the fastest one after the other, ROUNDS times,
so that the machine's drift (other jobs starting, thermal, page cache) hits both alike; the decision then rests
on those interleaved trials alone. So is a clear win of the less simple config: two trials minutes apart also
measure the machine in between (on the shared 2-core machine ZeRO-0 measured 2.3 and 18.5 samples/s in two runs
of the README demo back to back, and the first run picked ZeRO-2 on it: runs 3-4 of
benchmarks/results/pick_stability_cpu_load-none_before_side_by_side.json), so a config that asks more of the job
is recommended only when it also wins side by side. A clear win of the simpler config stands:
re-measuring could only confirm it or call a tie, and a tie picks it too.

Pure: trials arrive through an injected callable, as in autotune.search.walk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune.core.ladder import Candidate
from autotune.core.measurement import Speed

ROUNDS = 2  # interleaved rounds of a close call: A, B, A, B


def simplicity(candidate: Candidate) -> tuple[int, int, int, int]:
    """Smaller is simpler and safer: host offload, ladder position, checkpointing, mode parts."""
    rung = candidate.rung
    host = int(rung.offload_optimizer is not None or rung.offload_param is not None)
    return host, rung.order, int(candidate.grad_checkpointing), len(candidate.mode.parts)


@dataclass(frozen=True)
class Verdict:
    """What the pick is and how sure: the runner-up, the margin between their medians, and whether it is a tie."""

    pick: Candidate
    speed: Speed
    runner_up: Candidate | None = None
    runner_up_speed: Speed | None = None
    tie: bool = False
    remeasured: bool = False

    @property
    def margin(self) -> float | None:
        """Pick over runner-up, relative to the runner-up's median (negative when a tie picked the slower)."""
        if self.runner_up_speed is None:
            return None
        return self.speed.median / self.runner_up_speed.median - 1

    @property
    def spread(self) -> float:
        """The larger relative half-width of the two medians' intervals: the noise the margin is weighed by."""
        widths = [s.stats.half_width for s in (self.speed, self.runner_up_speed) if s is not None]
        return max(widths)

    def to_dict(self) -> dict:
        return {
            "pick": self.pick.to_dict(),
            "speed": self.speed.to_dict(),
            "runner_up": self.runner_up.to_dict() if self.runner_up else None,
            "runner_up_speed": self.runner_up_speed.to_dict() if self.runner_up_speed else None,
            "margin": self.margin,
            "spread": self.spread,
            "tie": self.tie,
            "remeasured": self.remeasured,
        }


def decide(speeds: dict[Candidate, Speed]) -> Verdict | None:
    """The pick from one speed per candidate (dict order breaks exact ties: pass candidates in trial order)."""
    if not speeds:
        return None
    ranked = sorted(speeds, key=lambda c: speeds[c].median, reverse=True)
    fastest = ranked[0]
    close = [c for c in ranked if c == fastest or not speeds[fastest].beats(speeds[c])]
    if len(close) == 1:
        runner_up = ranked[1] if len(ranked) > 1 else None
        return Verdict(fastest, speeds[fastest], runner_up, speeds[runner_up] if runner_up else None)
    pick = min(close, key=simplicity)
    other = next(c for c in close if c != pick)  # the fastest other than the pick
    return Verdict(pick, speeds[pick], other, speeds[other], tie=True)


def settle(
    speeds: dict[Candidate, Speed],
    remeasure: Callable[[Sequence[Candidate], int], dict[Candidate, Speed] | None],
) -> Verdict | None:
    """decide(), and when that is a tie or the less simple config's win, re-measure the two interleaved and decide
    again on those trials.

    `remeasure(candidates, rounds)` runs the rounds (A, B, A, B) and returns each candidate's pooled speed
    from them, or None when it could not (budget spent, a trial failed): the first verdict stands then.
    """
    verdict = decide(speeds)
    if verdict is None or verdict.runner_up is None or verdict.spread == 0:
        return verdict  # nothing to compare with, or steps without spread: measuring again would not move it
    if not verdict.tie and simplicity(verdict.pick) <= simplicity(verdict.runner_up):
        return verdict  # the simpler config's clear win: a re-measure could only confirm it or tie, picking it too
    again = remeasure((verdict.pick, verdict.runner_up), ROUNDS)
    if not again or len(again) < 2:
        return verdict
    final = decide(again)
    if final is None:
        return verdict
    return Verdict(final.pick, final.speed, final.runner_up, final.runner_up_speed, tie=final.tie, remeasured=True)
