"""Relations between candidates that hold by construction, not by the memory model: the same group (one memory
line, one speed line), needing at least another's device memory, and which is simpler (the order a tie is decided
in). Shared by the walk and the pick."""

from __future__ import annotations

from autotune.core.ladder import Candidate
from autotune.modes.search_view import is_ratio_mode


def same_group(a: Candidate, b: Candidate) -> bool:
    """Same rung, checkpointing and mode: the micro-batch is all that differs (one memory line, one speed line)."""
    return a.rung is b.rung and a.grad_checkpointing == b.grad_checkpointing and a.mode == b.mode


def holds_at_least_the_memory_of(candidate: Candidate, measured: Candidate) -> bool:
    """Whether `candidate` needs at least the device memory `measured` needed, by construction, not by the model:
    the same rung, a micro-batch no smaller (activations grow with it), checkpointing only if `measured` had it
    too (full checkpointing keeps each layer's input instead of its activations), and a mode that keeps no less on
    the device: the same mode, or a partial optimizer offload keeping at least as many optimizer sub-groups on
    the device (DeepSpeed keeps int((1 - ratio) x n) of them there, runtime/zero/stage3.py:1105; classic offload,
    ratio 1, keeps none). So where `measured` did not fit, `candidate` cannot: no trial is needed to know it."""
    if candidate.rung is not measured.rung or candidate.micro_batch < measured.micro_batch:
        return False
    if candidate.grad_checkpointing and not measured.grad_checkpointing:
        return False
    if candidate.mode == measured.mode:
        return True
    ratio_only = all(m.is_classic or is_ratio_mode(m) for m in (candidate.mode, measured.mode))
    return ratio_only and candidate.mode.offload_ratio <= measured.mode.offload_ratio


def simplicity(candidate: Candidate) -> tuple[int, int, int, int]:
    """Smaller is simpler and safer: host offload, ladder position, checkpointing, mode parts. A tie within noise
    goes to the simplest (pick_decision.decide); the walk's bounds drop what would lose one (speed.could_beat)."""
    rung = candidate.rung
    host = int(rung.offload_optimizer is not None or rung.offload_param is not None)
    return host, rung.order, int(candidate.grad_checkpointing), len(candidate.mode.parts)
