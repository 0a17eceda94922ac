"""Whose memory a trial's peak is: the allocator's own event trace, replayed to the peak.

`max_memory_allocated` says how much a trial needed; it cannot say which part of the memory model is off.
For that the trial records every allocation with its Python stack, replays the events to the moment the
allocated total was highest, and sums the blocks alive then by the line of code that allocated them:
`transformers/.../modeling_llama.py:NNN forward` is activations, `deepspeed/runtime/zero/...` is ZeRO's
buffers and gathered parameters, and so on. The GPU kit records it in its `sites` stage (four memory points,
ZeRO-3 + full offload first) and for its OOM probes (the memory model held to GPU truth: find which
component of the published-set gap is ours), so one GPU session answers per component, not per total.

The recorder is CUDA's caching allocator's own trace (`torch.cuda.memory._record_memory_history`, documented
with `_snapshot` in torch/cuda/memory.py and in PyTorch's "Understanding CUDA Memory Usage"): each event holds
the rounded block size and the Python stack, so the replayed peak equals `max_memory_allocated` when the
trace is whole. The CPU backend has no such trace. torch.profiler with Python stacks was tried as one: it
records every Python call, and reading that back took 9.4-10.0 GiB RSS and 99-112 s for a ZeRO-2/3 trial of a
182k-parameter GPT-2 here (0.5 GiB and 10-12 s without it), so a CPU trial reports that the figure needs CUDA.
The replay itself reads any trace in the documented format, the profiler's included (tests use it).

Allocated bytes fall at "free_requested", as torch's allocated_bytes statistic does (the block is no longer
a tensor's, though another stream may still use it until "free_completed").
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

MAX_EVENTS = 1_000_000  # ring buffer of the CUDA recorder; torch: "expect each entry to be several KB"
TOP_SITES = 30
NO_PYTHON_FRAME = "(no Python frame: autograd engine or C++)"
BEFORE_TRIAL = "(allocated before the trial started)"

# Frames inside torch's own plumbing say nothing about which part of the model's memory a block is; the first
# frame outside it does. torch.optim and activation checkpointing are kept: they are components of their own.
_TORCH_KEPT = ("torch/optim/", "torch/utils/checkpoint.py")
_PROFILER_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<name>.+)$")
_PACKAGE_ROOTS = ("site-packages/", "dist-packages/", "/src/")


@dataclass(frozen=True)
class Frame:
    file: str  # shortened: from the package root on ("deepspeed/runtime/zero/stage3.py")
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} {self.name}"


@dataclass(frozen=True)
class PeakSite:
    site: str  # "file:line function" of the first frame outside torch's plumbing
    bytes: int
    blocks: int


@dataclass(frozen=True, kw_only=True)
class PeakSites:
    source: str  # "cuda_allocator_trace"; tests: any trace in the documented format
    peak_bytes: int  # allocated total at the replayed peak, what was live before the trial included
    events: int
    complete: bool  # False: the CUDA ring buffer wrapped, blocks allocated before it are missing
    sites: list[PeakSite] = field(default_factory=list)  # largest first, TOP_SITES of them
    other_bytes: int = 0  # the sites after the first TOP_SITES
    packages: dict[str, int] = field(default_factory=dict)  # "deepspeed", "transformers", ...: bytes at the peak
    oom_request_bytes: int | None = None  # the allocation that failed, when the trace holds an OOM

    def to_dict(self) -> dict:
        return asdict(self)


def short_path(path: str) -> str:
    for root in _PACKAGE_ROOTS:
        if root in path:
            return path.rsplit(root, 1)[1]
    return path


def frames_of(raw: Iterable[dict]) -> list[Frame]:
    """Frames innermost first, from either recorder's format; frames without a file (builtins, module names) dropped."""
    frames = []
    for frame in raw:
        filename, line, name = frame.get("filename", ""), int(frame.get("line") or 0), str(frame.get("name", ""))
        if filename in ("", "none", "??"):  # the profiler's format: "torch/nn/modules/linear.py(130): forward"
            parsed = _PROFILER_FRAME.match(name)
            if not parsed:
                continue
            filename, line, name = parsed["file"], int(parsed["line"]), parsed["name"]
        frames.append(Frame(short_path(filename), line, name))
    return frames


def site_of(frames: list[Frame]) -> str:
    for frame in frames:
        if not frame.file.startswith("torch/") or frame.file.startswith(_TORCH_KEPT):
            return str(frame)
    return str(frames[0]) if frames else NO_PYTHON_FRAME


def package_of(site: str) -> str:
    if site.startswith("("):
        return site
    return site.split("/", 1)[0].split(":", 1)[0]


def replay(trace: list[dict], before_bytes: int = 0) -> tuple[int, dict[int, tuple[int, list[dict]]], int | None]:
    """(peak allocated, blocks alive at that moment by address, the size of a failed request if any).

    Two passes: the first finds the event at which the total peaked, the second stops there, so a trace of
    a million events is not copied at every new high. Blocks allocated before the recording began count in
    `before_bytes` throughout (the trace has no size for their frees); a trial's fresh process starts near 0.
    """
    total = peak = before_bytes
    peak_at = -1
    sizes: dict[int, int] = {}
    oom = None
    for index, event in enumerate(trace):
        action = event.get("action")
        if action == "alloc":
            sizes[event["addr"]] = int(event["size"])
            total += int(event["size"])
            if total > peak:
                peak, peak_at = total, index
        elif action == "free_requested" and event["addr"] in sizes:
            total -= sizes.pop(event["addr"])
        elif action == "oom":
            oom = int(event["size"])
    live: dict[int, tuple[int, list[dict]]] = {}
    for event in trace[: peak_at + 1]:
        if event.get("action") == "alloc":
            live[event["addr"]] = (int(event["size"]), event.get("frames") or [])
        elif event.get("action") == "free_requested":
            live.pop(event["addr"], None)
    return peak, live, oom


def attribute(
    trace: list[dict], source: str, *, before_bytes: int = 0, complete: bool = True, top: int = TOP_SITES
) -> PeakSites:
    peak, blocks, oom = replay(trace, before_bytes)
    by_site: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for size, raw_frames in blocks.values():
        entry = by_site[site_of(frames_of(raw_frames))]
        entry[0] += size
        entry[1] += 1
    if before_bytes:
        by_site[BEFORE_TRIAL] = [before_bytes, 0]
    ranked = sorted(by_site.items(), key=lambda item: -item[1][0])
    packages: dict[str, int] = defaultdict(int)
    for site, (size, _) in ranked:
        packages[package_of(site)] += size
    return PeakSites(
        source=source,
        peak_bytes=peak,
        events=len(trace),
        complete=complete,
        sites=[PeakSite(site, size, count) for site, (size, count) in ranked[:top]],
        other_bytes=sum(size for _, (size, _) in ranked[top:]),
        packages=dict(sorted(packages.items(), key=lambda item: -item[1])),
        oom_request_bytes=oom,
    )


class PeakSiteRecorder:
    """start() when the trial starts, finish() when it ends; never raises, a failure is reported in the result."""

    def __init__(self, device: str, local_rank: int) -> None:
        self.device = device
        self.local_rank = local_rank
        self._recording = False
        self._before_bytes = 0
        self._error: str | None = None

    def start(self) -> None:
        if self.device != "cuda":
            self._error = "needs a CUDA device: the allocation trace is the CUDA caching allocator's"
            return
        try:
            import torch

            self._before_bytes = int(torch.cuda.memory_allocated(self.local_rank))
            torch.cuda.memory._record_memory_history(
                "all", context="alloc", stacks="python", max_entries=MAX_EVENTS, clear_history=True
            )
            self._recording = True
        except Exception as error:  # an optional figure: the trial itself must not fail for it
            self._error = f"recording did not start: {type(error).__name__}: {error}"

    def finish(self) -> dict:
        if not self._recording:
            return {"error": self._error or "not recording"}
        try:
            import torch

            trace = torch.cuda.memory._snapshot()["device_traces"][self.local_rank]
            complete = len(trace) < MAX_EVENTS
            sites = attribute(trace, "cuda_allocator_trace", before_bytes=self._before_bytes, complete=complete)
            return sites.to_dict()
        except Exception as error:
            return {"error": f"{type(error).__name__}: {error}"}
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop recording without working anything out (a trial that ended before its figures were read)."""
        if not self._recording:
            return
        self._recording = False
        try:
            import torch

            torch.cuda.memory._record_memory_history(None)
        except Exception:  # best effort: the next start() clears the history anyway
            pass
