"""`autotune tune` (the default command): find the fastest config that fits and write ds_config.json."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.status import Status

from autotune.cli.options import (
    GlobalBatchOpt,
    GpuMemoryOpt,
    GpusOpt,
    GpuTypeOpt,
    JsonOpt,
    ModelOpt,
    NodesOpt,
    NvmePathOpt,
    PrecisionOpt,
    TrustRemoteCodeOpt,
)
from autotune.cli.output import console, err_console, print_json
from autotune.cli.parsing import parse_int_list, parse_rung_list
from autotune.cli.script_option import UserCommandArg
from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.search import SearchEvent
    from autotune.tuner import TuneResult


class _Progress:
    """Live status on stderr: which trial runs, for how long, how much budget is left."""

    def __init__(self, err: Console, max_trials: int, enabled: bool) -> None:
        self.err = err
        self.max_trials = max_trials
        self.enabled = enabled
        self.count = 0
        self.started = time.monotonic()
        self.status: Status | None = None

    def __call__(self, event: SearchEvent) -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.started
        if event.kind == "trial_start" and event.candidate:
            self.count += 1
            text = f"trial {self.count} (budget {self.max_trials}): {event.candidate.describe()}  [{elapsed:.0f} s]"
            self.status = self.err.status(text)
            self.status.start()
            return
        if self.status:
            self.status.stop()
            self.status = None
        if event.kind == "trial_end" and event.record:
            record = event.record
            result = record.result
            speed = f", {result.samples_per_s:.2f} samples/s" if result.samples_per_s else ""
            cached = " (cached)" if record.from_cache else ""
            status = result.status if record.within_headroom or not result.ok else "over headroom"
            detail = f": {result.error}" if result.error and not result.ok else ""
            self.err.print(
                f"  {record.candidate.key}: {status}{detail}, peak {format_bytes(result.peak_memory_bytes)}"
                f" (predicted {format_bytes(record.predicted_peak_bytes)}){speed}{cached}"
            )
        elif event.kind == "prepare":
            self.err.print(f"  {event.message}")
        elif event.kind == "skip":
            self.err.print(f"  skip {event.candidate.rung.value if event.candidate else ''}: {event.message}")


def _print_summary(result: TuneResult) -> None:
    out = console()
    data = result.report
    label = "verified by trials" if result.verified else "PLAN ONLY: not verified by trials"
    if result.from_cache:
        label += ", from cache"
    out.print(f"[bold]{data['model']['name']}[/bold] on {data['target_description']}: [bold]{label}[/bold]")
    choice = data["choice"]
    out.print(f"  choice: {choice['description']}")
    if result.samples_per_s:
        out.print(f"  measured: {result.samples_per_s:.2f} samples/s, peak {format_bytes(choice['peak_bytes'])}")
    else:
        out.print(f"  predicted peak: {format_bytes(choice['predicted_peak_bytes'])}")
    out.print(f"  trials launched: {result.trials_launched}, {result.elapsed_s:.1f} s")
    out.print(f"  config: {result.config_path}" + (f"  (HF: {result.hf_config_path})" if result.hf_config_path else ""))
    out.print(f"  report: {result.report_path}")
    own = data.get("own_command")
    out.print(f"  launch: {own['train_command'] if own else result.launch.deepspeed if result.launch else '-'}")


def tune_command(
    model: ModelOpt,
    gpus: GpusOpt = None,
    nodes: NodesOpt = 1,
    gpu_type: GpuTypeOpt = None,
    gpu_memory: GpuMemoryOpt = None,
    device: Annotated[
        str, typer.Option(help="cuda: trials on the GPUs here; cpu: real trials on the CPU backend.")
    ] = "cuda",
    memory_budget: Annotated[str | None, typer.Option(help="Per-rank memory cap for --device cpu, e.g. 2GiB.")] = None,
    seq_len: Annotated[
        int | None, typer.Option("--seq-len", "-s", help="Sequence length (default: model's, <=2048).")
    ] = None,
    global_batch: GlobalBatchOpt = None,
    precision: PrecisionOpt = None,
    headroom: Annotated[float, typer.Option(help="Peak must stay under this fraction of free memory.")] = 0.9,
    max_trials: Annotated[int, typer.Option(help="Most trials to launch.")] = 12,
    time_budget: Annotated[float | None, typer.Option(help="Stop launching trials after this many seconds.")] = None,
    max_micro_batch: Annotated[int, typer.Option(help="Largest micro-batch per GPU to consider.")] = 256,
    micro_batches: Annotated[str | None, typer.Option(help="Explicit micro-batch grid, e.g. 1,2,4,8.")] = None,
    rungs: Annotated[str | None, typer.Option(help="Restrict the ladder, e.g. z0,z2,z3+offload_opt.")] = None,
    nvme_path: NvmePathOpt = None,
    gpu_memory_fraction: Annotated[
        float | None, typer.Option(help="Emulate a smaller GPU (fraction of memory).")
    ] = None,
    trial_timeout: Annotated[float, typer.Option(help="Seconds before a trial is killed as hung.")] = 900.0,
    out: Annotated[str, typer.Option("--out", "-o", help="Where to write ds_config.json.")] = "ds_config.json",
    report_dir: Annotated[str | None, typer.Option(help="Where to write the report (default: beside --out).")] = None,
    hf: Annotated[bool, typer.Option("--hf", help='Also write an HF Trainer variant with "auto" values.')] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the results cache.")] = False,
    cache_dir: Annotated[str | None, typer.Option(help="Results cache file (SQLite).")] = None,
    script: Annotated[str, typer.Option(help="Training script named in the launch command.")] = "train.py",
    trust_remote_code: TrustRemoteCodeOpt = False,
    as_json: JsonOpt = False,
    command: UserCommandArg = None,
) -> None:
    """Find the fastest DeepSpeed config that fits, with real trials, and write ds_config.json."""
    from autotune.tuner import TuneRequest, tune

    request = TuneRequest(
        model=model,
        gpus=gpus,
        nodes=nodes,
        gpu_type=gpu_type,
        gpu_memory=gpu_memory,
        device=device,
        memory_budget=memory_budget,
        seq_len=seq_len,
        global_batch=global_batch,
        precision=precision,
        headroom=headroom,
        max_trials=max_trials,
        time_budget_s=time_budget,
        max_micro_batch=max_micro_batch,
        micro_batches=parse_int_list(micro_batches, "--micro-batches"),
        rungs=parse_rung_list(rungs),
        nvme_path=nvme_path,
        gpu_memory_fraction=gpu_memory_fraction,
        trial_timeout_s=trial_timeout,
        out=out,
        report_dir=report_dir,
        hf=hf,
        use_cache=not no_cache,
        cache_dir=cache_dir,
        script=script,
        trust_remote_code=trust_remote_code,
        command=tuple(command) if command else None,
    )
    progress = _Progress(err_console(), max_trials, enabled=not as_json)
    result = tune(request, observe=progress)
    if as_json:
        print_json(result.report)
        return
    _print_summary(result)


def register(app: typer.Typer) -> None:
    app.command("tune")(tune_command)
