"""The GPU validation kit: everything only a GPU can show, in stages that each append to one JSON.

    bash benchmarks/gpu/validate.sh                      # on the GPU machine (see README.md)
    bash benchmarks/gpu/validate.sh --dry-run            # CPU backend, tiny models: the kit's own test

Stages, most valuable first: setup (versions, DeepSpeed ops), memory (predicted vs measured peak per config),
oom (an emulated 24 GB card: predicted-over configs OOM and are classified so, memory comes back), tune (a real
tune on the emulated card, then the chosen config re-run for 50 steps), grid (the exhaustive grid on the same
card, for the tune's quality and cost). Every finished item is written at once (temp file, then rename) and
skipped on the next run, so a run cut off by a time limit resumes where it stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # benchmarks/: estimate_accuracy's environment() and predicted_trial()

from points import (  # noqa: E402
    DRY_LEASE_TUNE,
    DRY_MEMORY_POINTS,
    DRY_MODES,
    DRY_OOM_PROBES,
    DRY_SIDE_BY_SIDE,
    DRY_SITE_POINTS,
    DRY_TUNE,
    DRY_WARM_POINTS,
    EMULATED_CARD_GIB,
    GPU_MEMORY_POINTS,
    GPU_MODES,
    GPU_OOM_PROBES,
    GPU_SIDE_BY_SIDE,
    GPU_SITE_POINTS,
    GPU_TUNE,
    H200_WALL_S,
    LEASE_MEMORY_POINTS,
    LEASE_OOM_PROBES,
    LEASE_TUNE,
    LEASE_WARM_POINTS,
    SAMPLER_PERIODS_S,
    SMOKE_POINT,
    MemoryPoint,
    ModesSetting,
    TuneSetting,
)
from warm_check import compare, pick_confirmation, summary  # noqa: E402

from autotune.core.ladder import Candidate, Rung  # noqa: E402
from autotune.core.units import GiB  # noqa: E402
from autotune.estimate import EstimateSettings, check_fit, estimate  # noqa: E402
from autotune.estimate.runtime import RuntimeStack, local_stack  # noqa: E402
from autotune.hardware.specs import Target, generic_gpu  # noqa: E402
from autotune.infra.atomic import atomic_write_json, atomic_write_text  # noqa: E402
from autotune.models import resolve_model, summarize  # noqa: E402
from autotune.modes.applies import ratio_grid, ratio_mode  # noqa: E402
from autotune.trial import LocalLauncher, TrialLauncher, TrialResult, TrialSpec, WarmWorkerPool  # noqa: E402
from autotune.trial.launch.ops import ensure_ops_ready  # noqa: E402
from autotune.trial.worker.faults import FAULT_ENV  # noqa: E402
from estimate_accuracy import environment as machine_and_versions  # noqa: E402
from estimate_accuracy import predicted_trial  # noqa: E402

STAGES = (
    "setup", "smoke", "pinned", "memory", "warm", "sampler", "sites", "tune", "oom", "modes", "grid", "side_by_side",
)  # fmt: skip
MEMORY_SETS = ("all", "warm", "rest")  # --memory-set: the lease measures the warm stage's points first, the rest last
LEASE_HOST_MEMORY = "128GiB"  # the lent H200 machine's RAM (device README, Machine): stated, not probed (issue 42)
DEFAULT_RESULTS = REPO / "benchmarks" / "results" / "gpu" / "validation.json"


@dataclass
class Kit:
    """One run of the kit: where results go, what device, how much time is left.

    Every finished item is saved at once (results_path, atomically): put results_path in the device tool's $OUT
    and a command cut off by its time limit still brings back everything it finished. Each trial runs in its own
    directory under trials_dir (its rank and launcher logs); a trial that ran fine has it removed, a failed one
    keeps it, named in its row, and its logs' tails are appended to one file beside the results (`failure_log`):
    the device tool brings back at most 8 files from $OUT, so the logs travel as one.
    """

    results_path: Path
    dry_run: bool
    budget_s: float
    run_trial: Callable[[TrialSpec], TrialResult] | None = None  # tests swap it; None: LocalLauncher per trial
    started: float = field(default_factory=time.monotonic)
    data: dict = field(default_factory=dict)
    lease: bool = False  # the one-command lease's shorter lists (points.py LEASE_*)
    trials_dir: Path | None = None  # default: beside results_path (lease.sh puts it outside $OUT)
    plant_fault: str | None = None  # test seam: the trial whose key contains this fails (trial/worker/faults.py)
    memory_set: str = "all"  # which memory points the memory stage runs (MEMORY_SETS)
    emulate_h200: bool = False  # dry run: each item sleeps up to its cold-H200 wall (points.py H200_WALL_S)

    def emulate(self, kind: str, started: float) -> None:
        """Dry run with --emulate-h200: sleep until the item has taken its estimated cold-H200 wall."""
        self.emulate_until(H200_WALL_S[kind], started)

    def emulate_until(self, wall_s: float, started: float) -> None:
        if self.emulate_h200 and self.dry_run:
            time.sleep(max(0.0, min(wall_s - (time.monotonic() - started), self.time_left())))

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"

    def pick(self, dry: object, full: object, lease: object) -> Any:
        """The dry run's tiny setting, else the lease's short list or the full kit's."""
        return dry if self.dry_run else lease if self.lease else full

    def trials_root(self) -> Path:
        return self.trials_dir or self.results_path.parent / "trials"

    def launch(
        self, spec: TrialSpec, key: str, launcher: TrialLauncher | None = None
    ) -> tuple[TrialResult, str | None]:
        """Run one trial, in a fresh process unless a launcher is given (the warm stage's pool, whose workdir keeps
        the logs); (its result, the directory holding its logs when it failed)."""
        if self.run_trial is not None:
            return self.run_trial(spec), None
        if launcher is not None:
            result = launcher.run(spec)
            workdir = getattr(launcher, "workdir", None)
            if not result.ok and workdir is not None:
                append_logs(self.failure_log, key, result, workdir)
            return result, None if result.ok or workdir is None else str(workdir)
        workdir = self.trials_root() / key.replace("/", "__")
        shutil.rmtree(workdir, ignore_errors=True)  # an earlier run's logs of this item, which failed then
        planted = self.plant_fault is not None and self.plant_fault in key
        env = {FAULT_ENV: "raise@start"} if planted else {}
        result = LocalLauncher(env=env, workdir=workdir).run(spec)
        if result.ok:
            shutil.rmtree(workdir, ignore_errors=True)
            return result, None
        append_logs(self.failure_log, key, result, workdir)
        return result, str(workdir)

    @property
    def failure_log(self) -> Path:
        return self.results_path.with_name("trial-logs.txt")

    def stack(self) -> RuntimeStack:
        """The runtime stack the tuner would predict with here (context.runtime_stack): the GPU's compute
        capability from the probe, torch/CUDA/NCCL/transformers/DeepSpeed from package metadata."""
        if self.device != "cuda":
            return RuntimeStack()
        gpus = _nvml_gpus()
        return local_stack(gpus[0].get("compute_capability") if gpus else None)

    def load(self) -> None:
        if self.results_path.exists():
            self.data = json.loads(self.results_path.read_text())
        self.data.setdefault("runs", []).append(environment(self.device))

    def save(self) -> None:
        self.results_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.results_path, self.data)

    def section(self, name: str) -> dict:
        return self.data.setdefault(name, {})

    def time_left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def can_start(self, expected_s: float) -> bool:
        """Start an item only if it is expected to finish inside the budget (results of a killed item are lost)."""
        if self.time_left() < expected_s:
            log(f"stopping: {self.time_left():.0f} s left, the next item needs about {expected_s:.0f} s")
            return False
        return True


LOG_TAIL_LINES = 120  # per log file of a failed trial: the traceback and what led to it, not a whole build log


def append_logs(path: Path, key: str, result: TrialResult, workdir: Path) -> None:
    """Append the tails of a failed trial's logs (ranks, launcher) to path, atomically (temp file, rename)."""
    parts = [path.read_text() if path.exists() else ""]
    parts.append(f"===== {key}: {result.status}: {result.error}\n")
    for log_file in sorted(workdir.rglob("*.log")):
        lines = log_file.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        parts.append(f"----- {log_file.relative_to(workdir)} (last {len(lines)} lines)\n" + "\n".join(lines) + "\n")
    atomic_write_text(path, "".join(parts))


def log(message: str) -> None:
    print(f"[kit {time.strftime('%H:%M:%S')}] {message}", flush=True)


def environment(device: str) -> dict:
    """Machine, versions (as the CPU accuracy benchmark records them) and the GPUs NVML sees: no CUDA context."""

    info = machine_and_versions(device)
    try:
        info["versions"]["nvidia-ml-py"] = metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        info["versions"]["nvidia-ml-py"] = "not installed"
    if device == "cuda":
        info["gpus"] = _nvml_gpus()
    return info


def _nvml_gpus() -> list[dict]:
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                {
                    "index": index,
                    "name": pynvml.nvmlDeviceGetName(handle),
                    "total_bytes": int(memory.total),
                    "used_bytes": int(memory.used),
                    "driver": driver,
                    "compute_capability": "{}.{}".format(*pynvml.nvmlDeviceGetCudaComputeCapability(handle)),
                    "cuda_driver_version": pynvml.nvmlSystemGetCudaDriverVersion(),
                }
            )
        return gpus
    except Exception as error:  # recorded, not fatal: later stages still say what they can
        return [{"error": f"NVML: {error}"}]


def gpu_used_bytes() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
    except Exception:  # no NVML: the figure is optional
        return None


def gpu_total_bytes() -> int:
    gpus = _nvml_gpus()
    if not gpus or "total_bytes" not in gpus[0]:
        raise SystemExit("kit: no GPU visible through NVML (use --dry-run on a CPU machine)")
    return gpus[0]["total_bytes"]


# ---------------------------------------------------------------- setup


def stage_setup(kit: Kit) -> None:
    """Build the DeepSpeed ops trials load, in a child process; NVMe rungs only where libaio exists."""
    section = kit.section("setup")
    started = time.monotonic()
    notes: list[str] = []
    try:  # clears a killed build's stale lock first, and a build cut off by the budget is said, not raised
        section["ops"] = ensure_ops_ready(kit.device, timeout_s=max(60.0, kit.time_left()), report=notes.append)
    except RuntimeError as error:
        section["ops"] = {"error": str(error)}
    section["ops_notes"] = notes
    section["ops_wall_s"] = round(time.monotonic() - started, 1)
    section["async_io"] = _async_io_status(kit.device)
    section["probe"] = _probe_json()
    kit.save()
    log(f"setup: ops {section['ops']} in {section['ops_wall_s']} s; async_io {section['async_io']}")


def stage_smoke(kit: Kit) -> bool:
    """One ~15 s trial through the real trial path that needs no DeepSpeed op (tiny model, ZeRO-0, torch's AdamW, one
    step), right after the install and beside the op builds: False (said) when it failed, so the lease stops early."""
    section = kit.section("smoke")
    if section.get("status") == "ok":
        return True
    started = time.monotonic()
    row = trial_for(SMOKE_POINT, kit, fraction=None, budget=2 * GiB if kit.dry_run else None, steps=1, kind="smoke")
    section.update(row)
    section["wall_s"] = round(time.monotonic() - started, 1)
    kit.save()
    log(f"smoke: {row['status']} in {section['wall_s']} s {row.get('error') or ''}")
    return row["status"] == "ok"


def stage_pinned(kit: Kit) -> None:
    """Host RAM per pin_memory() request (benchmarks/gpu/pinned_probe.py, a child with its own CUDA context):
    checks the power-of-two rounding the host-RAM model counts for pinned offload tensors."""
    probe = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("pinned_probe.py"))],
        capture_output=True,
        text=True,
        timeout=max(60, min(300, kit.time_left())),
        check=False,
    )
    lines = probe.stdout.strip().splitlines()
    kit.section("pinned").update(
        json.loads(lines[-1]) if probe.returncode == 0 and lines else {"error": probe.stderr[-2000:]}
    )
    kit.save()
    log(f"pinned: {kit.section('pinned')}")


def _async_io_status(device: str) -> str:
    code = (
        "from deepspeed.accelerator import get_accelerator;"
        "b=get_accelerator().create_op_builder('AsyncIOBuilder');"
        "print('compatible' if b is not None and b.is_compatible(verbose=False) else 'unavailable')"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "DS_ACCELERATOR": device},
        timeout=300,
        check=False,
    )
    answer = run.stdout.strip().splitlines()[-1:] or ["unavailable"]
    if answer[0] != "compatible":
        return "unavailable (libaio not found): NVMe rungs are reported as not run"
    return "compatible"


def _probe_json() -> dict:
    run = subprocess.run(
        [sys.executable, "-m", "autotune", "probe", "--json"], capture_output=True, text=True, timeout=120, check=False
    )
    try:
        return json.loads(run.stdout)
    except ValueError:
        return {"error": (run.stderr or run.stdout)[-500:]}


# ---------------------------------------------------------------- memory


def trial_for(
    point: MemoryPoint,
    kit: Kit,
    *,
    fraction: float | None,
    steps: int = 3,
    budget: int | None = None,
    record_sites: bool = False,
    launcher: TrialLauncher | None = None,
    sample_period_s: float | None = None,
    kind: str | None = None,
) -> dict:
    """Run one config for real and put the prediction for exactly that config beside it.

    fraction emulates a smaller card on the GPU; budget caps each rank's RSS on the CPU backend; with
    neither, the limit is unbounded (the point is measured, not judged). record_sites: also say whose
    memory the peak was (trial/worker/peak_sites.py). sample_period_s: the NVML sampler's period (default the trial's).
    kind: the item's H200_WALL_S entry, for the dry run's --emulate-h200 (default: by the point's rung).
    """
    if budget:
        limit = budget
    elif fraction:
        limit = int(fraction * gpu_total_bytes())
    else:
        limit = 1024 * GiB
    target = Target(generic_gpu(limit), gpus_per_node=1, nodes=1, free_memory_bytes=limit)
    candidate = Candidate(point.rung, point.micro_batch, point.grad_checkpointing, point.mode)
    stack = kit.stack()
    summary, predicted, spec = predicted_trial(
        point.model,
        candidate,
        point.seq_len,
        target,
        kit.device,
        "bf16",
        zero_init=point.zero_init,
        warmup_steps=1,
        max_steps=steps,
        timeout_s=max(60.0, min(600.0, kit.time_left())),
        gpu_memory_fraction=fraction,
        host_memory_budget_bytes=budget,
        stack=stack,
        optimizer=point.optimizer,
    )
    # half the micro-batch timed after it, as the tuner's trials do (context.spec): its plain micro-steps' own peak
    # gives the row the point one launch implies there (TrialResult.smaller_peak_point)
    spec = dataclasses.replace(spec, record_peak_sites=record_sites, smaller_micro_batch=point.micro_batch // 2 or None)
    if sample_period_s is not None:
        spec = dataclasses.replace(spec, sample_period_s=sample_period_s)
    used_before = gpu_used_bytes() if kit.device == "cuda" else None
    started = time.monotonic()
    result, logs = kit.launch(spec, point.key, launcher)
    kit.emulate(kind or ("offload" if point.rung.offload_optimizer else "point"), started)
    row = {
        "key": point.key,
        "model": point.model,
        "params": summary.total_params,
        "rung": point.rung.value,
        "micro_batch": point.micro_batch,
        "seq_len": point.seq_len,
        "grad_checkpointing": point.grad_checkpointing,
        "mode": point.mode.to_dict(),
        "zero_init": point.zero_init,
        "optimizer": point.optimizer,
        "sample_period_s": spec.sample_period_s,
        "limit_bytes": limit if (fraction or budget) else None,
        "status": result.status,
        "error": result.error,
        "logs": logs,
        "wall_s": round(time.monotonic() - started, 1),
        "startup_s": result.startup_s,
        "phases": result.phases,  # imports, dist init, model build, engine init, warm-up, measured: plan with these
        "samples_per_s": result.samples_per_s,
        "step_times_s": result.step_times_s,
        "predicted_bytes": predicted.gpu_peak_bytes,
        "predicted_components": predicted.gpu_components,
        "predicted_host_bytes": predicted.host_ram_bytes,
        # on the whole card the allocator keeps more cached than under pressure (estimate.types): recorded so a
        # comparison can be redone either way, and used for the unpressured rows' reserved/NVML errors
        "predicted_unpressured_extra_bytes": predicted.gpu_unpressured_extra_bytes,
        "pressured": bool(fraction or budget),
        "predicted_stack": dataclasses.asdict(stack),
        "gpu_used_before_bytes": used_before,
        "gpu_used_after_bytes": gpu_used_bytes() if kit.device == "cuda" else None,
        "engine_facts": result.engine_facts,  # what DeepSpeed really ran: offload ratio, sub-groups, device share
    }
    if result.ranks:
        rank = result.ranks[0]
        row.update(
            max_allocated_bytes=rank.max_allocated_bytes,
            max_reserved_bytes=rank.max_reserved_bytes,
            nvml_peak_bytes=rank.device_used_bytes,  # this process's own (trial/worker/memory.py), not the card's used
            nvml_baseline_bytes=rank.device_used_baseline_bytes,
            nvml_source=rank.device_memory_source,
            outside_allocator_bytes=rank.device_outside_allocator_bytes,
            emulated_card_bytes=rank.emulated_card_bytes,
            host_rss_peak_bytes=rank.host_rss_peak_bytes,
            micro_peak_bytes=rank.micro_peak_bytes,
            smaller_micro_peak_bytes=rank.smaller_micro_peak_bytes,
            implied_smaller_peak=result.smaller_peak_point,  # (half micro-batch, the peak this launch implies there)
            allocator_settings=result.allocator_settings,  # PYTORCH_CUDA_ALLOC_CONF & co: peaks differ under them
            host_peak_reset=rank.host_peak_reset,
        )
        if record_sites:
            row["peak_sites"] = rank.peak_sites
    row.update(_errors(row, kit.device))
    return row


def _errors(row: dict, device: str) -> dict:
    """Signed error of the prediction against each measured figure, like for like.

    The prediction's total is what the device loses (it includes the CUDA context and NCCL buffers), so it is
    compared with the trial process's own device peak (NVML per process, trial/worker/memory.py). Without the context
    and NCCL terms it is compared with torch's max_memory_reserved; without the allocator slack too, with
    max_memory_allocated. On the CPU backend the prediction is one rank's peak RSS.

    The prediction is for a card under pressure; on the whole card (row["pressured"] false) the allocator keeps
    more cached, so the reserved and NVML figures are compared with the prediction plus the unpressured extra
    (estimate.types MemoryEstimate.gpu_unpressured_extra_bytes): without it they read as a 10-13% under-prediction
    where the model is right.
    """
    parts = row["predicted_components"]
    outside_torch = parts.get("cuda_context", 0) + parts.get("nccl_buffers", 0)
    extra = 0 if row.get("pressured", True) else row.get("predicted_unpressured_extra_bytes", 0)
    pairs = {"host_rss": (row["predicted_bytes"], row.get("host_rss_peak_bytes"))}
    if device == "cuda":
        nvml = row.get("nvml_peak_bytes")
        pairs = {
            "nvml": (row["predicted_bytes"] + extra, nvml),
            "reserved": (row["predicted_bytes"] + extra - outside_torch, row.get("max_reserved_bytes")),
            "allocated": (
                row["predicted_bytes"] - outside_torch - parts.get("allocator_slack", 0),
                row.get("max_allocated_bytes"),
            ),
            # Offload rungs pin optimizer states (and parameters) in host RAM: the trial's RSS peak is that figure.
            "host_ram": (row.get("predicted_host_bytes"), row.get("host_rss_peak_bytes")),
        }
    out = {}
    for name, (predicted, measured) in pairs.items():
        if measured and predicted:
            out[f"error_pct_{name}"] = round(100 * (predicted - measured) / measured, 1)
    return out


def stage_memory(kit: Kit) -> None:
    section = kit.section("memory")
    rows = section.setdefault("rows", {})
    points = memory_points(kit)
    budget = 4 * GiB if kit.dry_run else None  # CPU backend: measure RSS against a generous cap
    for point in points:
        if point.key in rows:
            continue
        if not kit.can_start(_expected_s(rows, 60 if not kit.dry_run else 30)):
            break
        log(f"memory: {point.key}")
        row = trial_for(point, kit, fraction=None, budget=budget)
        rows[point.key] = row
        section["summary"] = _memory_summary(rows)
        kit.save()
        errors = {k: v for k, v in row.items() if k.startswith("error_pct")}
        log(
            f"  {row['status']} nvml={_gib(row.get('nvml_peak_bytes'))} reserved={_gib(row.get('max_reserved_bytes'))}"
            f" predicted={_gib(row['predicted_bytes'])} errors={errors} {row.get('error') or ''}"
        )


def memory_points(kit: Kit) -> list[MemoryPoint]:
    """The memory stage's points for --memory-set: the warm stage's points (the lease measures them first, fresh),
    the rest (last, cheapest first), or all of them (the full kit: its own list, whose first points warm re-runs)."""
    warm = warm_points(kit)
    rest = kit.pick(DRY_MEMORY_POINTS, GPU_MEMORY_POINTS, LEASE_MEMORY_POINTS)
    if kit.memory_set == "warm":
        return list(warm)
    if kit.memory_set == "rest":
        return [p for p in rest if p not in warm]
    return [*warm, *(p for p in rest if p not in warm)]


def warm_points(kit: Kit) -> list[MemoryPoint]:
    """The points the warm stage re-runs: the lease's own (torch's AdamW, run beside the op builds; its dry run's
    tiny twins), else the memory list's first two."""
    if kit.lease:
        return list(DRY_WARM_POINTS if kit.dry_run else LEASE_WARM_POINTS)
    return list(kit.pick(DRY_MEMORY_POINTS, GPU_MEMORY_POINTS, GPU_MEMORY_POINTS)[:2])


def stage_warm(kit: Kit) -> None:
    """The memory stage's first points again in one warm worker pool, beside their fresh rows (warm_check.py): what
    decides whether GPU trials may run warm by default without their pick confirmed in a fresh process
    (request.asks.SearchAsk.trial_workers). A pool's order matters, so a cut-off run is not resumed: its rows stay,
    marked incomplete."""
    section = kit.section("warm")
    if section.get("rows"):
        return
    fresh = kit.data.get("memory", {}).get("rows", {})
    points = [p for p in warm_points(kit) if fresh.get(p.key, {}).get("status") == "ok"]
    if not points:
        log("warm: no fresh memory row to compare with; skipped")
        return
    budget = 4 * GiB if kit.dry_run else None  # as the memory stage measured them
    rows: list[dict] = []
    section["complete"] = False
    with WarmWorkerPool(workdir=kit.trials_root() / "warm-pool") as pool:  # the fresh rows' environment
        for point in [*points, points[0]]:  # the first again: measured by a worker that ran the others
            if not kit.can_start(1.2 * fresh[point.key]["wall_s"]):  # the point it re-runs, fresh: warm costs less
                break
            log(f"warm: {point.key}")
            warm = trial_for(point, kit, fraction=None, budget=budget, launcher=pool, kind="warm")
            row = compare(warm, fresh[point.key])
            rows.append(row)
            section["rows"], section["summary"] = rows, summary(rows, pool.restarts, pool.recycled)
            kit.save()
            diffs = {m: row[m]["warm_minus_fresh"] for m in ("max_allocated_bytes", "nvml_peak_bytes")}
            log(f"  {row['status']} warm - fresh {diffs} card used after {_gib(row['card_used_after_bytes'])}")
        section["complete"] = len(rows) == len(points) + 1
    kit.save()


def stage_sampler(kit: Kit) -> None:
    """The NVML sampler's cost to a ZeRO-3 step: the warm stage's ZeRO-3 point, measured fresh at the default period
    (its memory row), again at 1 s. A step slower at 10 ms by more than the spread says the sampler costs time."""
    section = kit.section("sampler")
    rows = section.setdefault("rows", {})
    point = warm_points(kit)[-1]
    fresh = kit.data.get("memory", {}).get("rows", {}).get(point.key)
    budget = 4 * GiB if kit.dry_run else None
    for period in SAMPLER_PERIODS_S:
        name = f"{period:g}s"
        if name in rows:
            continue
        if fresh is not None and period == fresh.get("sample_period_s"):
            rows[name] = fresh  # the memory stage measured it at this period already
            continue
        if not kit.can_start(1.2 * (fresh or {}).get("wall_s", H200_WALL_S["point"])):
            break
        log(f"sampler: {point.key} at {name}")
        rows[name] = trial_for(point, kit, fraction=None, budget=budget, sample_period_s=period)
        kit.save()
    section["summary"] = _sampler_summary(rows)
    kit.save()
    log(f"sampler: {section['summary']}")


def _sampler_summary(rows: dict) -> dict:
    """Per period: the median step and its spread (min-max of the measured steps); the difference says the cost."""
    out: dict = {}
    for name, row in rows.items():
        steps = row.get("step_times_s") or []
        if row.get("status") == "ok" and steps:
            out[name] = {
                "median_step_s": statistics.median(steps), "min_s": min(steps), "max_s": max(steps),
                "samples_per_s": row.get("samples_per_s"), "nvml_peak_bytes": row.get("nvml_peak_bytes"),
            }  # fmt: skip
    fast, slow = out.get(f"{SAMPLER_PERIODS_S[0]:g}s"), out.get(f"{SAMPLER_PERIODS_S[-1]:g}s")
    if fast and slow:
        overlap = fast["min_s"] <= slow["max_s"] and slow["min_s"] <= fast["max_s"]
        out["verdict"] = (
            "tie (the step ranges overlap)"
            if overlap
            else (
                "the 10 ms sampler costs step time" if fast["median_step_s"] > slow["median_step_s"] else "10 ms faster"
            )
        )
    return out


def stage_sites(kit: Kit) -> None:
    """Whose memory each peak is: memory points again with every allocation recorded (trial/worker/peak_sites.py).

    The rows sit beside the prediction's components (`predicted_components`), so a reader sees which component
    the model has wrong. The recording must not change GPU memory: each row's allocated peak is compared with
    its memory-stage twin where that ran.
    """
    section = kit.section("sites")
    rows = section.setdefault("rows", {})
    twins = kit.section("memory").get("rows", {})
    points = DRY_SITE_POINTS if kit.dry_run else GPU_SITE_POINTS
    budget = 4 * GiB if kit.dry_run else None
    for point in points:
        if point.key in rows:
            continue
        if not kit.can_start(_expected_s(rows, 60 if kit.dry_run else 120)):
            break
        log(f"sites: {point.key}")
        row = trial_for(point, kit, fraction=None, budget=budget, record_sites=True)
        ours, twin = row.get("max_allocated_bytes"), twins.get(point.key, {}).get("max_allocated_bytes")
        if ours and twin:
            row["allocated_vs_memory_stage_pct"] = round(100 * (ours - twin) / twin, 2)
        rows[point.key] = row
        kit.save()
        sites = row.get("peak_sites") or {}
        log(f"  {row['status']} peak {_gib(sites.get('peak_bytes'))} predicted {_gib(row['predicted_bytes'])}"
            f" {sites.get('error') or ''}")  # fmt: skip
        for site in sites.get("sites", [])[:5]:
            log(f"    {_gib(site['bytes'])} {site['site']}")


def _expected_s(rows: dict, default: float) -> float:
    walls = [r["wall_s"] for r in rows.values() if r.get("wall_s")]
    return max(walls) * 1.2 if walls else default


def _gib(value: int | None) -> str:
    return f"{value / GiB:.2f} GiB" if value else "-"


def _memory_summary(rows: dict) -> dict:
    ok = [r for r in rows.values() if r["status"] == "ok"]
    summary: dict = {"points": len(rows), "ok": len(ok)}
    for name in ("nvml", "reserved", "allocated", "host_ram", "host_rss"):
        errors = [r[f"error_pct_{name}"] for r in ok if f"error_pct_{name}" in r]
        if errors:
            summary[name] = {
                "median_abs_error_pct": round(statistics.median(abs(e) for e in errors), 1),
                "worst_abs_error_pct": round(max(abs(e) for e in errors), 1),
                "median_signed_error_pct": round(statistics.median(errors), 1),
                "under_predictions": sum(e < 0 for e in errors),
            }
    return summary


# ---------------------------------------------------------------- oom


def emulated_fraction(kit: Kit) -> float | None:
    if kit.dry_run:
        return None
    return min(1.0, EMULATED_CARD_GIB * GiB / gpu_total_bytes())


def stage_oom(kit: Kit) -> None:
    """Configs under an emulated 24 GB card: OOM classified as oom_gpu, and the memory back before the next."""
    section = kit.section("oom")
    rows = section.setdefault("rows", {})
    probes = kit.pick(DRY_OOM_PROBES, GPU_OOM_PROBES, LEASE_OOM_PROBES)
    fraction = emulated_fraction(kit)
    budget = 1 * GiB if kit.dry_run else None  # tight, so the over-budget probe is stopped early
    section["emulated_card"] = {"fraction": fraction, "gib": EMULATED_CARD_GIB, "cpu_budget_bytes": budget}
    for probe in probes:
        if probe.point.key in rows:
            continue
        if not kit.can_start(_expected_s(rows, H200_WALL_S["oom"])):  # an OOM probe fails at engine init: quick
            break
        log(f"oom: {probe.point.key} (predicted {'over' if probe.expect_oom else 'under'} the card)")
        # record_sites: at an OOM the replay's peak is the live set when the request failed, and the failed size
        row = trial_for(probe.point, kit, fraction=fraction, budget=budget, record_sites=True, kind="oom")
        expected = {"oom_gpu"} if kit.device == "cuda" else {"oom_host", "over_budget"}
        row["expect_oom"] = probe.expect_oom
        row["predicted_over_limit"] = row["predicted_bytes"] > row["limit_bytes"]
        row["verdict"] = (
            "as predicted"
            if (row["status"] in expected) == probe.expect_oom and (row["status"] == "ok") != probe.expect_oom
            else "NOT as predicted"
        )
        if kit.device == "cuda":
            before, after = row["gpu_used_before_bytes"], row["gpu_used_after_bytes"]
            row["memory_back"] = before is not None and after is not None and after <= before + 64 * 2**20
        rows[probe.point.key] = row
        kit.save()
        log(f"  {row['status']}: {row['verdict']} ({row.get('error') or ''})")


# ---------------------------------------------------------------- modern memory modes


def smallest_fitting_ratio(setting: ModesSetting, limit_bytes: int, device: str) -> float | None:
    """The smallest offload ratio on autotune.modes.applies' grid that the memory model says fits under limit_bytes.

    A plain scan (21 predictions): the kit checks the memory model and DeepSpeed, not the search's bisection.
    """
    summary = summarize(resolve_model(setting.model))
    target = Target(generic_gpu(limit_bytes), gpus_per_node=1, nodes=1, free_memory_bytes=limit_bytes)
    settings = EstimateSettings(seq_len=setting.seq_len, precision="bf16", device=device)
    for ratio in ratio_grid():
        candidate = Candidate(Rung.Z3_OFFLOAD_OPT, setting.micro_batch, setting.grad_checkpointing, ratio_mode(ratio))
        if check_fit(estimate(summary, target, candidate, settings), target).fits:
            return ratio
    return None


def mode_points(setting: ModesSetting, fitting_ratio: float | None) -> list[MemoryPoint]:
    """ZeRO-3, ZeRO-3 + full offload, partial offload at the set ratios plus the smallest that fits, the others."""
    ratios = sorted({*setting.ratios, *([fitting_ratio] if fitting_ratio is not None else [])} - {1.0})
    base = (setting.model, setting.micro_batch, setting.seq_len, setting.grad_checkpointing)
    return [
        MemoryPoint(base[0], Rung.Z3, *base[1:]),
        MemoryPoint(base[0], Rung.Z3_OFFLOAD_OPT, *base[1:]),
        *(MemoryPoint(base[0], Rung.Z3_OFFLOAD_OPT, *base[1:], mode=ratio_mode(r)) for r in ratios),
        *(MemoryPoint(base[0], rung, *base[1:], mode=mode) for rung, mode in setting.others),
    ]


def stage_modes(kit: Kit) -> None:
    """Partial optimizer offload on the emulated card beside ZeRO-3 and ZeRO-3 + offload: memory and speed."""
    section = kit.section("modes")
    rows = section.setdefault("rows", {})
    setting = DRY_MODES if kit.dry_run else GPU_MODES
    fraction = emulated_fraction(kit)
    budget = 3 * GiB if kit.dry_run else None
    limit = budget or int((fraction or 1.0) * gpu_total_bytes())
    if "smallest_fitting_ratio" not in section:
        section["smallest_fitting_ratio"] = smallest_fitting_ratio(setting, limit, kit.device)
        section["emulated_card"] = {"fraction": fraction, "gib": EMULATED_CARD_GIB, "cpu_budget_bytes": budget}
        kit.save()
    for point in mode_points(setting, section["smallest_fitting_ratio"]):
        if point.key in rows:
            continue
        if not kit.can_start(_expected_s(rows, 120 if not kit.dry_run else 60)):
            break
        log(f"modes: {point.key}")
        row = trial_for(point, kit, fraction=fraction, budget=budget, steps=setting.steps)
        row["predicted_fits"] = row["predicted_bytes"] <= limit
        rows[point.key] = row
        section["summary"] = _modes_summary(rows)
        kit.save()
        log(f"  {row['status']} predicted={_gib(row['predicted_bytes'])} samples/s={row.get('samples_per_s')}")


def _modes_summary(rows: dict) -> dict:
    """Per config: fits (measured), peak, speed; the fastest that ran, so the README can say who won."""
    table = []
    for row in rows.values():
        table.append(
            {
                "config": row["key"],
                "offload_ratio": row["mode"]["offload_ratio"] if row["rung"] == Rung.Z3_OFFLOAD_OPT.value else None,
                "mode": row["mode"],
                "status": row["status"],
                "predicted_fits": row["predicted_fits"],
                "predicted_bytes": row["predicted_bytes"],
                "measured_bytes": row.get("nvml_peak_bytes") or row.get("host_rss_peak_bytes"),
                "samples_per_s": row.get("samples_per_s"),
                "device_stepped_elements": row.get("engine_facts", {}).get("device_stepped_elements"),
            }
        )
    ran = [t for t in table if t["status"] == "ok" and t["samples_per_s"]]
    fastest = max(ran, key=lambda t: t["samples_per_s"])["config"] if ran else None
    return {"configs": table, "fastest_that_ran": fastest}


# ---------------------------------------------------------------- tune


def _tune_setting(kit: Kit) -> TuneSetting:
    if kit.dry_run and kit.lease:
        return DRY_LEASE_TUNE
    return kit.pick(DRY_TUNE, GPU_TUNE, LEASE_TUNE)


def _limit_args(kit: Kit) -> list[str]:
    if kit.dry_run:
        return ["--device", "cpu", "--memory-budget", "3GiB"]
    host = ["--host-memory", LEASE_HOST_MEMORY] if kit.lease else []  # a microVM's probe may see a fraction of it
    return ["--gpus", "1", "--gpu-memory-fraction", f"{emulated_fraction(kit):.4f}", *host]


def stage_tune(kit: Kit, out_dir: Path) -> None:
    """A real tune end to end through the CLI, then the chosen config re-run for 50 steps."""
    section = kit.section("tune")
    setting = _tune_setting(kit)
    if "result" not in section:
        if not kit.can_start(setting.min_tune_s):
            return
        tune_dir = out_dir / "tune"
        common = [
            "--model", setting.model, "--seq-len", str(setting.seq_len), "--rungs", setting.rungs_arg,
            "--max-trials", str(setting.max_trials), "--micro-batches", ",".join(map(str, setting.grid_micro_batches)),
            "--time-budget", str(max(60, int(kit.time_left() - setting.rerun_s - setting.reserve_s))),
            "--out", str(tune_dir / "ds_config.json"),
        ]  # fmt: skip
        if kit.dry_run and kit.lease:  # the GPU default's launchers on the CPU: the fresh confirmation runs too
            command = [sys.executable, str(HERE / "gpu_default_tune.py"), "--memory-budget", "3GiB", *common]
        else:
            command = [sys.executable, "-m", "autotune", "tune", *_limit_args(kit), *common, "--no-cache", "--json"]
        log("tune: " + " ".join(command[2:]))
        started = time.monotonic()
        # its progress (stderr) streams into the lease's log as it happens; only the report (stdout) is kept
        run = subprocess.run(command, stdout=subprocess.PIPE, text=True, timeout=max(120, kit.time_left()), check=False)
        if kit.emulate_h200 and kit.dry_run:  # its trials and the fresh confirmation, at cold-H200 walls
            kit.emulate_until((setting.max_trials + 1) * H200_WALL_S["tune_trial"], started)
        section["command"] = command[2:]
        section["exit_code"] = run.returncode
        section["wall_s"] = round(time.monotonic() - started, 1)
        try:
            section["result"] = json.loads(run.stdout)
        except ValueError:
            section["result"] = {"error": f"no report on stdout (exit {run.returncode}): {run.stdout[-2000:]}"}
        if confirmation := pick_confirmation(section["result"]):  # the pick warm vs in a fresh process
            section["fresh_confirmation"] = confirmation
            log(f"tune: pick confirmed fresh: {confirmation}")
        kit.save()
        log(f"tune: exit {run.returncode} in {section['wall_s']} s")
    result = section["result"]
    candidate = result.get("choice")  # the report's chosen config: rung, micro_batch, checkpointing, speed
    if "rerun" in section or not candidate or not setting.rerun_s:  # rerun_s 0: no re-run (the lease)
        return
    if not kit.can_start(setting.rerun_s):
        return
    point = choice_point(setting, candidate)
    log(f"tune: re-running the choice {point.key} for {setting.rerun_steps} steps")
    budget = 3 * GiB if kit.dry_run else None
    rerun = trial_for(point, kit, fraction=emulated_fraction(kit), budget=budget, steps=setting.rerun_steps)
    trial_speed = candidate.get("samples_per_s")
    if rerun.get("samples_per_s") and trial_speed:
        rerun["speed_vs_trial_pct"] = round(100 * (rerun["samples_per_s"] - trial_speed) / trial_speed, 1)
    section["rerun"] = rerun
    kit.save()
    log(f"  re-run {rerun['status']}, {rerun.get('samples_per_s')} samples/s vs trial {trial_speed}")


def choice_point(setting: TuneSetting, choice: dict) -> MemoryPoint:
    """The tune's choice as a kit point, its mode (offload ratio, ZenFlow, ...) kept: the re-run is that config."""
    candidate = Candidate.from_dict(choice)
    return MemoryPoint(
        setting.model, candidate.rung, candidate.micro_batch, setting.seq_len, candidate.grad_checkpointing,
        mode=candidate.mode,
    )  # fmt: skip


# ---------------------------------------------------------------- grid


def grid_points(setting: TuneSetting) -> list[MemoryPoint]:
    """Every rung x checkpointing x micro-batch of the tune's space, smallest micro-batch first."""
    return [
        MemoryPoint(setting.model, rung, mb, setting.seq_len, ckpt)
        for rung in setting.rungs
        for ckpt in setting.grid_checkpointing
        for mb in setting.grid_micro_batches
    ]


def stage_grid(kit: Kit) -> None:
    """The exhaustive grid on the same emulated card; micro-batches above a (rung, ckpt) OOM are skipped as OOM."""
    section = kit.section("grid")
    rows = section.setdefault("rows", {})
    setting = _tune_setting(kit)
    fraction = emulated_fraction(kit)
    budget = 3 * GiB if kit.dry_run else None
    for point in grid_points(setting):
        if point.key in rows:
            continue
        group = f"{point.rung.value}{'+ckpt' if point.grad_checkpointing else ''}"
        failed_below = any(
            r["group"] == group and r["status"] != "ok" and r["micro_batch"] < point.micro_batch for r in rows.values()
        )
        if failed_below:
            rows[point.key] = {"group": group, "micro_batch": point.micro_batch, "status": "skipped: smaller mb failed"}
            continue
        if not kit.can_start(_expected_s(rows, 60)):
            break
        log(f"grid: {point.key}")
        row = trial_for(point, kit, fraction=fraction, budget=budget)
        row["group"] = group
        rows[point.key] = row
        section["summary"] = _grid_summary(kit, rows)
        kit.save()
        log(f"  {row['status']} {row.get('samples_per_s')} samples/s")
    section["complete"] = len(rows) == len(grid_points(setting))
    section["summary"] = _grid_summary(kit, rows)
    kit.save()


def _grid_summary(kit: Kit, rows: dict) -> dict:
    measured = [r for r in rows.values() if r.get("samples_per_s")]
    trials = [r for r in rows.values() if "wall_s" in r]
    summary: dict = {"trials": len(trials), "wall_s": round(sum(r["wall_s"] for r in trials), 1)}
    if measured:
        best = max(measured, key=lambda r: r["samples_per_s"])
        summary["best"] = {"key": best["key"], "samples_per_s": best["samples_per_s"]}
    tune = kit.section("tune")
    chosen = tune.get("result", {}).get("choice")
    if chosen and measured:
        key = choice_point(_tune_setting(kit), chosen).key
        if key in rows and rows[key].get("samples_per_s"):
            ratio = rows[key]["samples_per_s"] / summary["best"]["samples_per_s"]
            summary["tune_choice_vs_grid_best"] = round(ratio, 3)
        else:  # a mode or a point the grid skipped: said, not silently left out of the comparison
            summary["tune_choice_not_in_grid"] = key
        trials_used = tune["result"].get("trials_launched") or len(tune["result"].get("trials", []))
        if trials_used:
            summary["tune_trials_vs_grid_trials"] = round(trials_used / max(1, len(trials)), 3)
        if tune.get("wall_s"):
            summary["tune_wall_vs_grid_wall"] = round(tune["wall_s"] / max(1.0, summary["wall_s"]), 3)
    return summary


# ---------------------------------------------------------------- side by side


def stage_side_by_side(kit: Kit, out_dir: Path) -> None:
    """compare_tuners.py on the same card: autotune vs DeepSpeed Autotuning (fast) vs the grid, in one run.

    Not resumable (the three methods must share one machine state), so it runs last and only when the
    remaining budget covers its expected length.
    """
    section = kit.section("side_by_side")
    if "exit_code" in section and section["exit_code"] == 0:
        return
    expected = 120 if kit.dry_run else 480
    if not kit.can_start(expected):
        return
    suffix = "dry_run" if kit.dry_run else "gpu"
    json_path = (out_dir if kit.dry_run else kit.results_path.parent) / f"compare_{suffix}.json"
    args = (DRY_SIDE_BY_SIDE if kit.dry_run else GPU_SIDE_BY_SIDE).args
    command = [
        sys.executable, str(REPO / "benchmarks" / "compare_tuners.py"), *args, "--out-json", str(json_path),
        "--chart", str(json_path.with_suffix(".png")), "--markdown", str(json_path.with_suffix(".md")),
        "--workdir", str(out_dir / "compare-work"),
    ]  # fmt: skip
    log("side by side: " + " ".join(command[2:]))
    started = time.monotonic()
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=max(60, kit.time_left()), check=False)
        section["exit_code"] = run.returncode
        section["tail"] = (run.stdout + run.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        section["exit_code"] = None
        section["tail"] = "timed out: the kit's budget ran out first"
    section["wall_s"] = round(time.monotonic() - started, 1)
    section["results"] = str(json_path.relative_to(REPO)) if json_path.is_relative_to(REPO) else str(json_path)
    kit.save()
    log(f"side by side: exit {section['exit_code']} in {section['wall_s']} s")


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="CPU backend, tiny models: exercises every stage")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {','.join(STAGES)}")
    parser.add_argument("--results", type=Path, default=None, help=f"JSON to append to (default {DEFAULT_RESULTS})")
    parser.add_argument("--out", type=Path, default=Path("autotune-out/gpu-kit"), help="scratch dir for tune output")
    parser.add_argument("--budget-s", type=float, default=540.0, help="start no item expected to end after this")
    parser.add_argument("--fresh", action="store_true", help="ignore earlier results in --results")
    parser.add_argument("--lease", action="store_true", help="the one-command lease's short lists (lease.sh)")
    parser.add_argument("--trials-dir", type=Path, default=None, help="per-trial scratch (default: beside --results)")
    parser.add_argument("--plant-fault", default=None, help="test seam: the trial whose key contains this fails")
    parser.add_argument("--memory-set", choices=MEMORY_SETS, default="all", help="which memory points to run")
    parser.add_argument("--emulate-h200", action="store_true", help="dry run: items take their cold-H200 walls")
    args = parser.parse_args(argv)
    unknown = set(args.stages.split(",")) - set(STAGES)
    if unknown:
        parser.error(f"unknown stage(s) {', '.join(sorted(unknown))}; choose from {', '.join(STAGES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = args.results or (args.out / "validation-dry-run.json" if args.dry_run else DEFAULT_RESULTS)
    if args.fresh and results.exists():
        results.unlink()
    if args.dry_run:
        os.environ["DS_ACCELERATOR"] = "cpu"
    kit = Kit(
        results, args.dry_run, args.budget_s, lease=args.lease, plant_fault=args.plant_fault,
        trials_dir=args.trials_dir, memory_set=args.memory_set, emulate_h200=args.emulate_h200,
    )  # fmt: skip
    kit.load()
    kit.save()
    stages = args.stages.split(",")
    for stage in STAGES:
        if stage not in stages:
            continue
        if kit.time_left() <= 0:
            break
        log(f"stage {stage}")
        if stage == "setup":
            stage_setup(kit)
        elif stage == "smoke" and not stage_smoke(kit):
            log("smoke trial failed: stopping (its row and logs say why)")
            return 3
        elif stage == "pinned":
            stage_pinned(kit)
        elif stage == "memory":
            stage_memory(kit)
        elif stage == "warm":
            stage_warm(kit)
        elif stage == "sampler":
            stage_sampler(kit)
        elif stage == "sites":
            stage_sites(kit)
        elif stage == "oom":
            stage_oom(kit)
        elif stage == "modes":
            stage_modes(kit)
        elif stage == "tune":
            stage_tune(kit, args.out)
        elif stage == "grid":
            stage_grid(kit)
        elif stage == "side_by_side":
            stage_side_by_side(kit, args.out)
    log(f"wrote {results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
