"""`autotune tune` (the default command): find the fastest config that fits and write ds_config.json."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.status import Status

from autotune.cli.options import (
    AllowApproximateOpt,
    AttentionOpt,
    BaseConfigOpt,
    CacheDirOpt,
    D,
    DecoderSeqLenOpt,
    DeviceOpt,
    GlobalBatchOpt,
    GpuMemoryFractionOpt,
    GpuMemoryOpt,
    GpusOpt,
    GpuTypeOpt,
    HeadroomOpt,
    HostMemoryOpt,
    JsonOpt,
    KernelsOpt,
    LoraRankOpt,
    LoraTargetsOpt,
    MaxMicroBatchOpt,
    MaxTrialsOpt,
    MemoryBudgetOpt,
    MicroBatchesOpt,
    ModelOpt,
    NodesOpt,
    NvmePathOpt,
    OptimizerOpt,
    OutOpt,
    OwnConsumerOpt,
    PrecisionOpt,
    ReportDirOpt,
    RungsOpt,
    SeqLenOpt,
    TrialTimeoutOpt,
    TrialWorkersOpt,
    TrustRemoteCodeOpt,
    UserCommandArg,
    VerboseOpt,
    say_assumed_units,
)
from autotune.cli.output import console, err_console, print_json, stamped
from autotune.cli.request import request_from_options
from autotune.core.units import format_bytes, format_duration
from autotune.dsconfig.launchers import world_size_line
from autotune.infra.terminate import Terminated, sigterm_raises
from autotune.report.pick import measured_detail, measurement_lines, not_tried_line, summary_head, trial_status
from autotune.request.tune_request import with_tune_time_budget

if TYPE_CHECKING:
    from autotune.core.ladder import Candidate
    from autotune.hook.leader import BestVerified
    from autotune.report.data import TuneReport
    from autotune.search.records import SearchEvent
    from autotune.tuner import TuneRequest, TuneResult


class TrialProgress:
    """Progress on stderr: a live status on a terminal; plain timestamped lines in a log (SLURM, CI), with a
    line when each trial starts, so a hung trial is visible as one."""

    def __init__(
        self,
        err: Console,
        max_trials: int | None,
        enabled: bool,
        verbose: bool = False,
        time_budget_s: float | None = None,
    ) -> None:
        self.err = err
        self.max_trials = max_trials  # None until the tuner says the derived budget (SearchEvent.trial_budget)
        # --time-budget: it starts when the op builds are done, right before the first trial (tuner.py), so the
        # first trial's start stands for it here, within the seconds a warm pool takes to start
        self.time_budget_s = time_budget_s
        self.budget_started: float | None = None
        self.enabled = enabled
        self.verbose = verbose  # each trial's interval, step count and single-step spread (pick_summary)
        self.live = err.is_terminal
        self.count = 0
        self.started = time.monotonic()
        self.status: Status | None = None
        self.trial_started: float | None = None
        self.durations: list[float] = []  # wall seconds of each trial launched so far (not cache reads)

    def line(self, message: str) -> None:
        if self.live:
            self.err.print(f"  {message}")
        else:
            print(stamped(message), file=sys.stderr, flush=True)

    def __call__(self, event: SearchEvent) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        elapsed = now - self.started
        if event.trial_budget is not None:
            self.max_trials = event.trial_budget
        if event.kind == "trial_start" and event.candidate:
            self.count += 1
            self.trial_started = now
            self.budget_started = now if self.budget_started is None else self.budget_started
            text = (
                f"trial {self.count} (budget {self.max_trials or '?'}): {event.candidate.describe()}  [{elapsed:.0f} s]"
                f"{self.eta()}"
            )
            if self.live:
                self.status = self.err.status(text)
                self.status.start()
            else:
                self.line(f"started {text}")
            return
        if self.status:
            self.status.stop()
            self.status = None
        if event.kind == "trial_end" and event.record:
            record = event.record
            if not record.from_cache and self.trial_started is not None:
                self.durations.append(now - self.trial_started)
            result = record.result
            speed = f", {result.samples_per_s:.2f} samples/s" if result.samples_per_s else ""
            if self.verbose and (detail := measured_detail(result)):
                speed = f", {detail}"
            cached = " (cached)" if record.from_cache else ""
            status = trial_status(result, record.within_headroom)
            detail = f": {result.error}" if result.error and not result.ok else ""
            self.line(
                f"{record.candidate.key}: {status}{detail}, peak {format_bytes(result.peak_memory_bytes)}"
                f" (predicted {format_bytes(record.predicted_peak_bytes)}){speed}{cached}"
            )
        elif event.kind == "prepare":
            self.line(event.message)
        elif event.kind == "skip":
            self.line(f"skip {_group_label(event.candidate)}: {event.message}")

    def eta(self) -> str:
        """What the trials so far say about this one and the rest: nothing before one has run."""
        if not self.durations:
            return ""
        typical = statistics.median(self.durations)
        left = max((self.max_trials or self.count) - self.count, 0)
        spread = f" ({format_duration(min(self.durations))}-{format_duration(max(self.durations))})"
        return (
            f"; expect ~{format_duration(typical)}, the median of {len(self.durations)} trial(s) so far"
            f"{spread if len(self.durations) > 1 else ''}; at most {left} more after it"
            f" (~{format_duration(left * typical)}{self._budget_end(left * typical)})"
        )

    def _budget_end(self, rest_s: float) -> str:
        """Where the time budget ends the search before the trials left would: said beside their estimate."""
        if self.time_budget_s is None or self.budget_started is None:
            return ""
        budget_left = max(0.0, self.time_budget_s - (time.monotonic() - self.budget_started))
        if budget_left >= rest_s:
            return ""
        return f"; the time budget stops the search in ~{format_duration(budget_left)}"


def _group_label(candidate: Candidate | None) -> str:
    """'z3+offload_opt + ckpt (offload ratio 0.5)': the skipped group, its checkpointing and any mode."""
    if candidate is None:
        return ""
    ckpt = " + ckpt" if candidate.grad_checkpointing else ""
    mode = "" if candidate.mode.is_classic else f" ({candidate.mode.label})"
    return f"{candidate.rung.value}{ckpt}{mode}"


def _shape(report: TuneReport, world_size: int) -> tuple[int, int]:
    """(ranks per node, nodes) of the target the report was tuned for; one node when the report does not say."""
    gpus, nodes = report.target.get("gpus_per_node"), report.target.get("nodes")
    if isinstance(gpus, int) and isinstance(nodes, int) and gpus * nodes == world_size:
        return gpus, nodes
    return world_size, 1


def _print_summary(result: TuneResult, verbose: bool = False) -> None:
    out = console()
    report = result.report
    if report is None:  # tune() always reports; only a caller's own TuneResult may lack one
        return
    headline, *lead = summary_head(report, result.verified, result.from_cache)
    out.print(headline, style="bold", markup=False, highlight=False)  # a model path may hold "[/]"
    for index, line in enumerate(lead):
        out.print(f"  {line}", style="bold" if index == 0 else None, markup=False, highlight=False)
    for line in measurement_lines(report) if verbose else []:
        out.print(f"  {line}", markup=False, highlight=False)
    if batch := report.batch:
        style = "bold yellow" if batch.chosen_by == "autotune" else "bold"
        out.print(
            f"  [{style}]global batch {batch.global_batch}[/{style}] = micro-batch {batch.micro_batch}"
            f" x accumulation {batch.accumulation} x {batch.world_size} rank(s): {batch.how}",
            highlight=False,
        )
        out.print(f"  {world_size_line(batch.world_size, *_shape(report, batch.world_size))}", markup=False)
    out.print(f"  trials launched: {result.trials_launched}, {result.elapsed_s:.1f} s")
    hf = f"  (HF: {result.hf_config_path})" if result.hf_config_path else ""
    out.print(f"  config: {result.config_path}{hf}", markup=False)
    out.print(f"  report: {result.report_path}", markup=False)
    if own := report.own_command:
        out.print(f"  launch (your command): {own.train_command}", highlight=False, markup=False)
    elif result.launch:
        out.print(f"  launch (DeepSpeed script): {result.launch.deepspeed}", highlight=False, markup=False)
        out.print(f"  launch (HF Trainer):       {result.launch.hf_trainer}", highlight=False, markup=False)
        out.print("  torchrun and accelerate launch: see the report", highlight=False)
    if stopped := not_tried_line(report):
        out.print(f"  {stopped}", style="bold yellow", markup=False, highlight=False)
    for note in report.notes:
        out.print(f"  note: {note}", markup=False)


def tune_command(
    model: ModelOpt,
    gpus: GpusOpt = D.hardware.gpus,
    nodes: NodesOpt = D.hardware.nodes,
    gpu_type: GpuTypeOpt = D.hardware.gpu_type,
    gpu_memory: GpuMemoryOpt = D.hardware.gpu_memory,
    device: DeviceOpt = D.hardware.device,
    memory_budget: MemoryBudgetOpt = D.hardware.memory_budget,
    seq_len: SeqLenOpt = D.model.seq_len,
    decoder_seq_len: DecoderSeqLenOpt = D.model.decoder_seq_len,
    global_batch: GlobalBatchOpt = D.training.global_batch,
    precision: PrecisionOpt = D.training.precision,
    attention: AttentionOpt = D.model.attention,
    headroom: HeadroomOpt = D.search.headroom,
    max_trials: MaxTrialsOpt = D.search.max_trials,
    time_budget: Annotated[
        float | None,
        typer.Option(
            help="Seconds of search (after the first DeepSpeed op builds): no trial starts after it and one still"
            " running is stopped; the best verified config is written. Default: 600 with --device cpu, none on GPUs."
        ),
    ] = None,
    max_micro_batch: MaxMicroBatchOpt = D.search.max_micro_batch,
    micro_batches: MicroBatchesOpt = None,
    rungs: RungsOpt = None,
    nvme_path: NvmePathOpt = D.hardware.nvme_path,
    gpu_memory_fraction: GpuMemoryFractionOpt = D.hardware.gpu_memory_fraction,
    trial_timeout: TrialTimeoutOpt = D.search.trial_timeout_s,
    out: OutOpt = D.output.out,
    report_dir: ReportDirOpt = D.output.report_dir,
    hf: Annotated[bool, typer.Option("--hf", help="No effect: the HF variant is always written.")] = D.output.hf,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the results cache.")] = False,
    cache_dir: CacheDirOpt = D.output.cache_dir,
    script: Annotated[
        str | None, typer.Option(help="Your training script, named in the launch commands (must exist).")
    ] = D.training.script,
    tokens_per_step: Annotated[
        int | None, typer.Option(help="Global batch in tokens per optimizer step (instead of --global-batch).")
    ] = D.training.tokens_per_step,
    optimizer: OptimizerOpt = D.training.optimizer,
    lora_rank: LoraRankOpt = D.model.lora_rank,
    kernels: KernelsOpt = D.model.kernels,
    consumer: OwnConsumerOpt = None,
    lora_targets: LoraTargetsOpt = None,
    host_memory: HostMemoryOpt = D.hardware.host_memory,
    trust_remote_code: TrustRemoteCodeOpt = D.model.trust_remote_code,
    allow_approximate: AllowApproximateOpt = D.search.allow_approximate,
    trial_workers: TrialWorkersOpt = D.search.trial_workers,
    base_config: BaseConfigOpt = D.training.base_config,
    as_json: JsonOpt = False,
    verbose: VerboseOpt = False,
    command: UserCommandArg = None,
) -> None:
    """Find the fastest DeepSpeed config that fits, with real trials, and write ds_config.json.

    Exit codes: 0 config written, 2 bad input (or no trial could complete), 3 nothing fits.
    """
    request = with_tune_time_budget(request_from_options("tune", locals()))
    from autotune.hook.leader import BestVerified
    from autotune.tuner import tune

    say_assumed_units(gpu_memory=gpu_memory, memory_budget=memory_budget, host_memory=host_memory)
    progress = TrialProgress(
        err_console(), max_trials, enabled=not as_json, verbose=verbose, time_budget_s=request.search.time_budget_s
    )
    best = BestVerified(progress)
    try:
        with sigterm_raises():
            result = tune(request, observe=best)
    except Terminated as stopped:
        raise Terminated(_on_terminated(request, best, stopped), signum=stopped.signum) from None
    if as_json:
        print_json(result.report.to_json() if result.report else {})
        return
    _print_summary(result, verbose)


def _on_terminated(request: TuneRequest, best: BestVerified, stopped: Terminated) -> str:
    """SIGTERM or SIGINT mid-tuning: trials are stopped and their temp dirs gone by now; finished trials are in
    the cache when there is a usable one (a rerun resumes from them). Write the best config verified so far, if
    any, and say so. tune() wrote every file from the best config verified so far when the search had one (its
    message says so); else, where the signal came outside the search with a trial verified, the config alone is
    written here."""
    if stopped.files_written:
        return str(stopped)
    if best.record is None:
        resumes = "a rerun resumes" if stopped.resumable else "no usable results cache: a rerun measures again"
        return f"{stopped.stopped_by} before any trial verified a config; nothing written ({resumes})"
    from autotune.dsconfig.emit import write_configs
    from autotune.tuner import ds_config_for, world_size_for

    candidate = best.record.candidate
    config = ds_config_for(request, candidate)
    # not re-validated: its trial just ran DeepSpeed with this config at this world size, and importing
    # DeepSpeed here would spend most of the grace period before SIGKILL
    path, _ = write_configs(
        config, world_size_for(request), Path(request.output.out), request.output.hf, validate=False
    )
    return f"{stopped.stopped_by}; wrote the best config verified so far ({candidate.describe()}) to {path}"


def register(app: typer.Typer) -> None:
    app.command("tune")(tune_command)
