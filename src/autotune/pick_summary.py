"""The lines the terminal summary and autotune-report.md lead with, from the report's JSON, so both say the same:
the pick and its speed with spread, the runner-up and the margin (or the tie), the memory headroom left, and what
the pick needs from the host."""

from __future__ import annotations

from typing import Any

from autotune.ladder import Candidate
from autotune.units import format_bytes


def _speed(speed: dict[str, Any]) -> str:
    low, high = speed["interval"]
    return (
        f"{speed['samples_per_s']:.2f} samples/s ({low:.2f}-{high:.2f}, {speed['confidence']:.0%} interval of the"
        f" median of {speed['steps']} whole optimizer steps)"
    )


def _label(candidate: dict[str, Any]) -> str:
    return Candidate.from_dict(candidate).describe()


def speed_lines(data: dict[str, Any]) -> list[str]:
    """The pick's speed with its spread, then the runner-up and the margin, or the tie with both figures."""
    choice, verdict = data.get("choice") or {}, data.get("verdict")
    if not verdict:
        if choice.get("samples_per_s"):
            return [f"Speed: {choice['samples_per_s']:.2f} samples/s (one measurement, no spread known)."]
        return ["Speed: not measured (plan only)."]
    lines = [f"Speed: {_speed(verdict['speed'])}."]
    runner_up, other = verdict.get("runner_up"), verdict.get("runner_up_speed")
    if not runner_up or not other:
        lines.append("Runner-up: none (nothing else fitted).")
    elif verdict["tie"]:
        lines.append(
            f"Tie within noise: {_label(verdict['pick'])} at {verdict['speed']['samples_per_s']:.2f} and"
            f" {_label(runner_up)} at {other['samples_per_s']:.2f} samples/s ({verdict['margin']:+.1%}, spread"
            f" +-{verdict['spread']:.1%}): picked the simpler, safer config."
        )
    else:
        lines.append(
            f"Runner-up: {_label(runner_up)}, {_speed(other)}; the pick is {verdict['margin']:+.1%} faster,"
            f" beyond the spread (+-{verdict['spread']:.1%})."
        )
    if verdict.get("remeasured"):
        lines.append("Close call: re-measured interleaved (A, B, A, B); decided on those trials.")
    return lines


def memory_line(data: dict[str, Any]) -> str:
    """Peak against the limit, and what is left."""
    choice, limit = data.get("choice") or {}, data.get("limit_bytes")
    peak = choice.get("peak_bytes")
    what = "measured peak" if peak else "predicted peak"
    peak = peak or choice.get("predicted_peak_bytes")
    where = "rank (host RSS)" if data.get("device") == "cpu" else "GPU"
    if not peak or not limit:
        return f"Memory: {what} {format_bytes(peak)} per {where}."
    left = limit - peak
    return (
        f"Memory: {what} {format_bytes(peak)} of the {format_bytes(limit)} limit per {where}"
        f" ({data['headroom']:.0%} of free): {format_bytes(max(0, left))} left ({left / limit:.0%})."
    )


def host_line(data: dict[str, Any]) -> str:
    """What the pick needs from the host: RAM per node, how much of it pinned, NVMe."""
    need = data.get("host_need")
    if not need:
        return "Host: nothing beyond the training processes."
    if data.get("device") == "cpu":
        return "Host: the CPU backend's memory is host RAM: the peak above is all of it (nothing pinned)."
    parts = [f"host RAM {format_bytes(need['ram_bytes'])} per node"]
    parts.append(f"{format_bytes(need['pinned_bytes'])} of it pinned" if need.get("pinned_bytes") else "none pinned")
    if need.get("nvme_bytes"):
        parts.append(f"NVMe {format_bytes(need['nvme_bytes'])} per node")
    origin = "measured" if need.get("measured") else "predicted"
    return f"Host: needs {', '.join(parts)} ({origin})."


def lead_lines(data: dict[str, Any]) -> list[str]:
    """Pick, speed, runner-up or tie, memory, host: the first thing a reader sees."""
    choice = data.get("choice")
    if not choice:
        return []
    return [f"Pick: {choice['description']}.", *speed_lines(data), memory_line(data), host_line(data)]
