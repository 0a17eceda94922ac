"""`tune()`: probe -> model -> estimate -> search with real trials -> emit ds_config.json and a report."""

from __future__ import annotations

import contextlib
import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from autotune.cache import ResultsCache, library_versions, run_key
from autotune.dsconfig import TrainSettings, build_ds_config
from autotune.emit import LaunchCommands, launch_commands, write_configs
from autotune.errors import NothingFitsError, UserError
from autotune.estimate import plan
from autotune.estimate.types import EstimateSettings
from autotune.hardware import GpuSpec, Target
from autotune.ladder import Candidate, Rung
from autotune.models import ModelSummary, resolve_model, summarize
from autotune.paths import cache_dir
from autotune.probe import probe
from autotune.report import write_report
from autotune.search import Search, SearchEvent, SearchLimits, SearchOutcome
from autotune.speed import prior_speed
from autotune.target import check_counts, resolve_target
from autotune.trial.types import TrialLauncher, TrialResult, TrialSpec
from autotune.units import parse_bytes


@dataclass(frozen=True)
class TuneRequest:
    model: str
    gpus: int | None = None
    nodes: int = 1
    gpu_type: str | None = None
    gpu_memory: str | None = None
    device: str = "cuda"  # "cuda" or "cpu" (real trials on the CPU backend)
    memory_budget: str | None = None  # per-rank cap for --device cpu, e.g. "2GiB"
    seq_len: int | None = None
    global_batch: int | None = None
    precision: str | None = None
    headroom: float = 0.9
    max_trials: int = 12
    time_budget_s: float | None = None
    max_micro_batch: int = 256
    micro_batches: tuple[int, ...] | None = None  # explicit grid; default powers of two
    rungs: tuple[Rung, ...] | None = None  # restrict the ladder
    nvme_path: str | None = None
    gpu_memory_fraction: float | None = None
    trial_timeout_s: float = 900.0
    out: str = "ds_config.json"
    report_dir: str | None = None  # default: the config's directory
    hf: bool = False
    use_cache: bool = True
    cache_dir: str | None = None
    script: str = "train.py"
    trust_remote_code: bool = False
    command: tuple[str, ...] | None = None  # the user's launch command: trials run it (trial/script_mode.py)


@dataclass
class TuneResult:
    verified: bool  # True when the choice ran for real; False for a plan-only recommendation
    candidate: Candidate | None
    ds_config: dict | None
    config_path: Path | None
    hf_config_path: Path | None
    report_path: Path | None
    report_json_path: Path | None
    launch: LaunchCommands | None
    samples_per_s: float | None
    trials_launched: int
    from_cache: bool
    elapsed_s: float
    report: dict = field(repr=False, default_factory=dict)


def _check_request(request: TuneRequest) -> None:
    check_counts(request.gpus, request.nodes)
    if request.device not in ("cuda", "cpu"):
        raise UserError(f"--device must be cuda or cpu, got {request.device!r}")
    if not 0 < request.headroom <= 1:
        raise UserError(f"--headroom must be in (0, 1], got {request.headroom}")
    if request.precision not in (None, "bf16", "fp16", "fp32"):
        raise UserError(f"--precision must be bf16, fp16 or fp32, got {request.precision!r}")
    if request.seq_len is not None and request.seq_len <= 0:
        raise UserError(f"--seq-len must be positive, got {request.seq_len}")
    if request.global_batch is not None and request.global_batch <= 0:
        raise UserError(f"--global-batch must be positive, got {request.global_batch}")
    if request.max_trials <= 0:
        raise UserError(f"--max-trials must be positive, got {request.max_trials}")
    if request.gpu_memory_fraction is not None and not 0 < request.gpu_memory_fraction <= 1:
        raise UserError(f"--gpu-memory-fraction must be in (0, 1], got {request.gpu_memory_fraction}")
    if request.command is not None:
        from autotune.trial.script_mode import check_command

        check_command(request)


def _cpu_target(request: TuneRequest) -> Target:
    """The CPU backend: each rank is a process; its memory budget plays the role of GPU free memory."""
    host = probe(request.nvme_path).host
    ranks = request.gpus or 1
    budget = (
        parse_bytes(request.memory_budget, what="--memory-budget")
        if request.memory_budget
        else (host.ram_available_bytes // ranks)
    )
    cpu = GpuSpec(
        key="cpu",
        name=f"CPU rank ({platform.processor() or platform.machine()})",
        memory_bytes=budget,
        bf16=True,
        source="CPU backend (DS_ACCELERATOR=cpu, gloo)",
    )
    return Target(cpu, ranks, request.nodes, budget, host.ram_available_bytes, host.nvme_free_bytes, measured=True)


def _gpu_target(request: TuneRequest) -> Target:
    planned = bool(request.gpu_type or request.gpu_memory)
    probed = probe(request.nvme_path) if not planned or request.nvme_path else None
    target = resolve_target(probed, request.gpus, request.nodes, request.gpu_type, request.gpu_memory)
    if request.gpu_memory_fraction and target.measured:
        emulated = int(request.gpu_memory_fraction * target.gpu.memory_bytes)
        target = replace(target, free_memory_bytes=min(target.free_memory_bytes, emulated))
    return target


def _default_seq_len(model: ModelSummary) -> int:
    if model.max_positions:
        return min(2048, int(model.max_positions))
    return 512  # relative-position models (T5) were pre-trained at 512


def micro_batch_grid(request: TuneRequest, world_size: int) -> list[int]:
    grid = list(
        request.micro_batches
        or [2**i for i in range(request.max_micro_batch.bit_length()) if 2**i <= request.max_micro_batch]
    )
    if request.global_batch is None:
        return sorted(grid)
    per_rank, remainder = divmod(request.global_batch, world_size)
    if remainder or per_rank == 0:
        raise UserError(f"--global-batch {request.global_batch} is not a multiple of the world size {world_size}")
    if request.micro_batches is None:
        grid = [d for d in range(1, min(per_rank, request.max_micro_batch) + 1) if per_rank % d == 0]
    eligible = sorted(m for m in grid if per_rank % m == 0)
    if not eligible:
        raise UserError(
            f"no micro-batch in {grid} gives a whole gradient accumulation for global batch"
            f" {request.global_batch} at world size {world_size}"
        )
    return eligible


def _rungs(request: TuneRequest) -> tuple[list[Rung], list[tuple[Rung, str]]]:
    chosen = list(request.rungs or Rung)
    unavailable = []
    if not request.nvme_path:
        unavailable = [(r, "no --nvme-path given") for r in chosen if r.needs_nvme]
    return [r for r in chosen if not any(r is u for u, _ in unavailable)], unavailable


class _Context:
    """Everything derived from a request that the steps below share."""

    def __init__(self, request: TuneRequest) -> None:
        _check_request(request)
        self.request = request
        self.model = summarize(resolve_model(request.model, request.trust_remote_code))
        self.target = _cpu_target(request) if request.device == "cpu" else _gpu_target(request)
        self.verified = self.target.measured
        self.precision = request.precision or ("bf16" if self.target.gpu.bf16 else "fp16")
        self.seq_len = request.seq_len or _default_seq_len(self.model)
        if self.model.max_positions and self.seq_len > self.model.max_positions:
            raise UserError(f"--seq-len {self.seq_len} exceeds the model's {self.model.max_positions} positions")
        self.settings = EstimateSettings(seq_len=self.seq_len, precision=self.precision, device=request.device)
        self.train = TrainSettings(
            world_size=self.target.world_size,
            precision=self.precision,
            global_batch=request.global_batch,
            hidden_size=self.model.hidden_size,
            nvme_path=request.nvme_path,
        )
        self.grid = micro_batch_grid(request, self.target.world_size)
        self.rungs, self.unavailable = _rungs(request)
        self.key = run_key(
            {
                "model": self.model.fingerprint,
                "gpu": [self.target.gpu.name, self.target.gpu.memory_bytes],
                "free": self.target.free_memory_bytes // 2**30,
                "gpus": self.target.gpus_per_node,
                "nodes": self.target.nodes,
                "device": request.device,
                "verified": self.verified,
                "versions": library_versions(),
                "seq_len": self.seq_len,
                "global_batch": request.global_batch,
                "precision": self.precision,
                "headroom": request.headroom,
                "grid": self.grid,
                "rungs": [r.value for r in self.rungs],
                "fraction": request.gpu_memory_fraction,
                **({"command": list(request.command)} if request.command else {}),
            }
        )
        self.cache = (
            ResultsCache(Path(request.cache_dir) if request.cache_dir else cache_dir() / "results.sqlite")
            if request.use_cache
            else None
        )

    def spec(self, candidate: Candidate) -> TrialSpec:
        request = self.request
        return TrialSpec(
            model_config=self.model.config,
            architecture=self.model.architecture,
            family=self.model.family,
            ds_config=build_ds_config(candidate, self.train),
            seq_len=self.seq_len,
            grad_checkpointing=candidate.grad_checkpointing,
            device="cpu" if request.device == "cpu" else "cuda",
            nprocs_per_node=self.target.gpus_per_node,
            nodes=self.target.nodes,
            timeout_s=request.trial_timeout_s,
            gpu_memory_fraction=request.gpu_memory_fraction,
            host_memory_budget_bytes=int(request.headroom * self.target.free_memory_bytes)
            if request.device == "cpu"
            else None,
            peak_tflops=self.target.gpu.peak_tflops(self.precision),
            trust_remote_code=self.model.trust_remote_code,
        )


def _prepare_ops(device: str, observe: Callable[[SearchEvent], None]) -> None:
    """Compile DeepSpeed's JIT ops once before the first trial, so no trial timeout absorbs minutes of ninja."""
    from autotune.trial.ops import ops_built, prebuild_ops

    if ops_built(device):
        return
    observe(
        SearchEvent("prepare", message="building DeepSpeed ops once (minutes; cached in ~/.cache/torch_extensions)")
    )
    try:
        prebuild_ops(device)
    except (RuntimeError, OSError) as error:
        raise UserError(str(error)) from None


@contextlib.contextmanager
def _launcher_for(device: str, given: TrialLauncher | None) -> Iterator[TrialLauncher]:
    """The caller's launcher, else warm workers on the CPU backend (start-up paid once) or a fresh
    process per GPU trial (a GPU trial must give all its memory back before the next one)."""
    if given is not None:
        yield given
        return
    from autotune.trial import LocalLauncher, WarmWorkerPool

    if device != "cpu":
        yield LocalLauncher()
        return
    # glibc keeps freed arenas; returning large frees to the OS makes peak RSS the working set the memory
    # model predicts (about 20% lower than default glibc on CPU trials; benchmarks/results/estimate.md).
    with WarmWorkerPool(env={"MALLOC_MMAP_THRESHOLD_": "65536"}) as pool:
        yield pool


def _script_launcher(request: TuneRequest) -> TrialLauncher | None:
    """Own-command mode: every trial runs the user's launch command (trial/script.py)."""
    if request.command is None:
        return None
    from autotune.trial.script import ScriptLauncher

    return ScriptLauncher(request.command)


def _search(ctx: _Context, launcher: TrialLauncher, observe: Callable[[SearchEvent], None]) -> SearchOutcome:
    cached = ctx.cache.trials(ctx.key) if ctx.cache else {}

    def run(candidate: Candidate) -> tuple[TrialResult, bool]:
        if candidate in cached:
            return cached[candidate], True
        result = launcher.run(ctx.spec(candidate))
        if ctx.cache and result.status != "timeout":  # a timeout may be the budget, not the config
            ctx.cache.put_trial(ctx.key, candidate, result)
        return result, False

    request = ctx.request
    search = Search(
        ctx.model,
        ctx.target,
        ctx.settings,
        run,
        ctx.rungs,
        ctx.grid,
        SearchLimits(request.max_trials, request.time_budget_s, request.headroom),
        observe,
    )
    return search.run_search()


def _plan_choice(ctx: _Context) -> tuple[Candidate | None, dict]:
    """Plan-only: among the rows the memory model says fit, the one with the highest prior speed."""
    result = plan(ctx.model, ctx.target, ctx.settings, ctx.request.headroom, ctx.request.global_batch)
    candidates = []
    for row in result.rows:
        mb = _largest_in_grid(ctx.grid, row.micro_batch) if row.micro_batch else None
        if mb and row.rung in ctx.rungs:
            candidates.append(Candidate(row.rung, mb, row.grad_checkpointing))
    return max(candidates, key=prior_speed, default=None), result.to_dict()


def _largest_in_grid(grid: list[int], limit: int) -> int | None:
    return max((m for m in grid if m <= limit), default=None)


def _smallest_shortfall(plan_data: dict | None, outcome: SearchOutcome | None) -> str:
    shortfalls = [
        row["verdict"]["shortfall_bytes"]
        for row in (plan_data or {}).get("rows", [])
        if row["verdict"]["shortfall_bytes"] > 0
    ]
    if outcome is not None:
        shortfalls += [
            t.result.peak_memory_bytes - t.limit_bytes
            for t in outcome.trials
            if t.result.peak_memory_bytes and t.result.peak_memory_bytes > t.limit_bytes
        ]
    if not shortfalls:
        return "no rung could be tried"
    from autotune.units import format_bytes

    return f"smallest shortfall {format_bytes(min(shortfalls))} per {'rank' if outcome else 'GPU'}"


def _report_data(
    ctx: _Context,
    candidate: Candidate | None,
    outcome: SearchOutcome | None,
    plan_data: dict | None,
    config_path: Path | None,
    hf_path: Path | None,
    launch: LaunchCommands | None,
    elapsed_s: float,
) -> dict:
    request = ctx.request
    best = outcome.best if outcome else None
    choice = None
    if candidate is not None:
        from autotune.estimate import estimate

        choice = {
            **candidate.to_dict(),
            "description": candidate.describe(),
            "samples_per_s": best.result.samples_per_s if best else None,
            "tokens_per_s": best.result.tokens_per_s if best else None,
            "peak_bytes": best.result.peak_memory_bytes if best else None,
            "predicted_peak_bytes": estimate(ctx.model, ctx.target, candidate, ctx.settings).gpu_peak_bytes,
        }
    skipped = [
        {"rung": r.value, "grad_checkpointing": ck, "reason": why} for r, why in ctx.unavailable for ck in (False, True)
    ]
    return {
        "model": {k: v for k, v in ctx.model.to_dict().items() if k != "config"},
        "target": ctx.target.to_dict(),
        "target_description": ctx.target.describe(),
        "device": request.device,
        "verified": ctx.verified and outcome is not None,
        "seq_len": ctx.seq_len,
        "precision": ctx.precision,
        "world_size": ctx.target.world_size,
        "global_batch": request.global_batch,
        "headroom": request.headroom,
        "limit_bytes": int(request.headroom * ctx.target.free_memory_bytes),
        "micro_batch_grid": ctx.grid,
        "choice": choice,
        "config_path": str(config_path) if config_path else None,
        "hf_config_path": str(hf_path) if hf_path else None,
        "launch": launch.to_dict() if launch else None,
        "trials": [t.to_dict() for t in outcome.trials] if outcome else [],
        "skipped": ([s.to_dict() for s in outcome.skipped] if outcome else []) + skipped,
        "trials_launched": outcome.trials_launched if outcome else 0,
        "stop_reason": outcome.stop_reason if outcome else "plan only: no trials on this machine",
        "calibration": outcome.calibration.to_dict() if outcome else None,
        "plan": plan_data,
        "elapsed_s": elapsed_s,
        "versions": library_versions(),
        "from_cache": False,
        "nothing_fits_reason": None if candidate else _smallest_shortfall(plan_data, outcome),
    }


def tune(
    request: TuneRequest | None = None,
    *,
    launcher: TrialLauncher | None = None,
    observe: Callable[[SearchEvent], None] = lambda event: None,
    **options: object,
) -> TuneResult:
    """Find the fastest config that fits and write it; `tune(model="gpt2", gpus=8)` or `tune(TuneRequest(...))`.

    Raises UserError on bad input and NothingFitsError when no candidate fits.
    """
    started = time.monotonic()
    request = request or TuneRequest(**options)  # type: ignore[arg-type]
    ctx = _Context(request)
    out_path = Path(request.out)
    report_dir = Path(request.report_dir) if request.report_dir else out_path.parent
    if ctx.cache and (hit := ctx.cache.recommendation(ctx.key)):
        return _from_cache(ctx, hit, out_path, report_dir, started)
    outcome = None
    plan_data = None
    if ctx.verified:
        if launcher is None:
            _prepare_ops(request.device, observe)
        with _launcher_for(request.device, launcher or _script_launcher(request)) as chosen:
            outcome = _search(ctx, chosen, observe)
        candidate = outcome.best.candidate if outcome.best else None
    else:
        candidate, plan_data = _plan_choice(ctx)
    if candidate is None:
        data = _report_data(ctx, None, outcome, plan_data, None, None, None, time.monotonic() - started)
        write_report(data, report_dir)
        raise NothingFitsError(f"nothing fits {ctx.target.describe()}: {data['nothing_fits_reason']}")
    config = build_ds_config(candidate, ctx.train)
    if request.command:
        from autotune.trial.script_mode import emitted_config

        config = emitted_config(request, config)
    config_path, hf_path = write_configs(config, ctx.target.world_size, out_path, request.hf)
    launch = launch_commands(config_path, candidate, ctx.target.gpus_per_node, ctx.target.nodes, request.script)
    data = _report_data(ctx, candidate, outcome, plan_data, config_path, hf_path, launch, time.monotonic() - started)
    if request.command and config_path:
        from autotune.trial.script_mode import command_report

        data["own_command"] = command_report(request, ctx.spec(candidate), config_path)
    report_md, report_json = write_report(data, report_dir)
    if ctx.cache and ctx.verified:
        ctx.cache.put_recommendation(ctx.key, {"candidate": candidate.to_dict(), "ds_config": config, "report": data})
    best = outcome.best if outcome else None
    return TuneResult(
        ctx.verified,
        candidate,
        config,
        config_path,
        hf_path,
        report_md,
        report_json,
        launch,
        best.result.samples_per_s if best else None,
        outcome.trials_launched if outcome else 0,
        False,
        time.monotonic() - started,
        data,
    )


def ds_config_for(request: TuneRequest, candidate: Candidate) -> dict:
    """The ds_config `tune(request)` emits for `candidate`, the same one its trial ran with.

    For callers whose tuning was cut short (the pre-launch hook): the search reports each verified
    trial as it finishes, and this turns the best of them into the config to write.
    """
    return build_ds_config(candidate, _Context(request).train)


def _from_cache(ctx: _Context, hit: dict, out_path: Path, report_dir: Path, started: float) -> TuneResult:
    candidate = Candidate.from_dict(hit["candidate"])
    config = hit["ds_config"]
    # Validated before it was cached, at this world size and DeepSpeed version (both are in the key).
    config_path, hf_path = write_configs(config, ctx.target.world_size, out_path, ctx.request.hf, validate=False)
    launch = launch_commands(config_path, candidate, ctx.target.gpus_per_node, ctx.target.nodes, ctx.request.script)
    data = {
        **hit["report"],
        "from_cache": True,
        "trials_launched": 0,
        "config_path": str(config_path),
        "hf_config_path": str(hf_path) if hf_path else None,
        "launch": launch.to_dict(),
        "elapsed_s": time.monotonic() - started,
    }
    report_md, report_json = write_report(data, report_dir)
    choice = data.get("choice") or {}
    return TuneResult(
        True,
        candidate,
        config,
        config_path,
        hf_path,
        report_md,
        report_json,
        launch,
        choice.get("samples_per_s"),
        0,
        True,
        time.monotonic() - started,
        data,
    )
