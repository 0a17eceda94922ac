"""Whether a stored answer (the results cache's final pick for the same question) still answers it now: its
figures plausible, its peak within today's limit, memory not binding where the limit grew, and its config
the one this version builds for its candidate.
"""

from __future__ import annotations

import logging

from autotune.core.ladder import Candidate
from autotune.request.context import TuneContext
from autotune.search.cache import ResultsCache, StoredAnswer
from autotune.search.records import SearchOutcome
from autotune.tuning.trials import run_bounds

log = logging.getLogger(__name__)

# A stored answer found under limit L0 still answers a question with limit L when its measured peak fits L and
# either L is at most 5% above L0 (jitter) or memory did not bind the search at L0. If L < L0, the stored choice
# was the fastest of a superset of what fits now, so it is still the fastest; if memory did not bind, more
# memory changes nothing.
ANSWER_GROWTH_TOLERANCE = 1.05


def cached_answer(ctx: TuneContext, cache: ResultsCache) -> StoredAnswer | None:
    """A stored answer that still holds for the memory free now (see above); else None, and the search runs
    (reusing the cached trials of this limit bucket)."""
    hit = cache.recommendation(ctx.answer_key)
    if hit is None:
        return None
    choice = hit.report.choice
    peak = choice.peak_bytes if choice else None
    speed = choice.samples_per_s if choice else None
    tokens_per_s = speed * ctx.seq_len if speed is not None else None
    candidate = hit.candidate
    if why := run_bounds(ctx).why_implausible_figures(candidate, tokens_per_s, [peak] if peak is not None else []):
        log.warning("autotune: dropped the cached answer as corrupt: %s; tuning again", why)
        return None
    if peak is None or peak > ctx.limit_bytes:
        return None
    if ctx.limit_bytes > hit.limit_bytes * ANSWER_GROWTH_TOLERANCE and hit.memory_bound:
        return None
    if hit.ds_config != ctx.emitted_config(candidate):
        # a stored config is never written just because it was stored
        log.warning("autotune: the cached config differs from the one built for its candidate; tuning again")
        return None
    return hit


def memory_bound(ctx: TuneContext, outcome: SearchOutcome) -> bool:
    """Whether more memory could have changed the answer: a trial ran out of memory (or over the headroom), or
    the most memory-hungry candidate (first rung, largest micro-batch, no checkpointing) was predicted not to fit."""
    from autotune.estimate import estimate

    if any(t.memory_failure for t in outcome.trials):
        return True
    hungriest = Candidate(ctx.rungs[0], max(ctx.grid), False)
    return estimate(ctx.model, ctx.target, hungriest, ctx.settings).gpu_peak_bytes > ctx.limit_bytes
