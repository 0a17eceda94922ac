"""`autotune plan`: the memory model's prediction for every rung of the ladder, without running anything."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from autotune.cli.options import (
    AllowApproximateOpt,
    AttentionOpt,
    D,
    DecoderSeqLenOpt,
    DeviceOpt,
    GlobalBatchOpt,
    GpuMemoryFractionOpt,
    GpuMemoryOpt,
    GpusOpt,
    GpuTypeOpt,
    GradCkptOpt,
    HeadroomOpt,
    HostMemoryOpt,
    JsonOpt,
    KernelsOpt,
    LoraRankOpt,
    LoraTargetsOpt,
    MaxMicroBatchOpt,
    MemoryBudgetOpt,
    MicroBatchesOpt,
    MicroBatchOpt,
    ModelOpt,
    NodesOpt,
    NvmePathOpt,
    OptimizerOpt,
    PrecisionOpt,
    RungsOpt,
    SeqLenOpt,
    TrustRemoteCodeOpt,
    UserConfigOpt,
    say_assumed_units,
)
from autotune.cli.output import console, print_json
from autotune.cli.request import request_from_options
from autotune.core.units import format_bytes
from autotune.errors import NothingFitsError, UserError
from autotune.estimate import PlanRow

if TYPE_CHECKING:
    from autotune.check.fit import ConfigFit
    from autotune.estimate import EstimateSettings
    from autotune.modes.mode_summary import ModeSummary
    from autotune.request.context import TuneContext
    from autotune.tuning.recommend import Recommendation

_SHORT_LIMITS = {
    "gpu": "over GPU by",
    "host": "over host RAM by",
    "nvme": "over NVMe by",
}


def _status(row: PlanRow) -> str:
    if row.micro_batch:
        return "[green]fits[/green]"
    verdict = row.verdict
    if verdict.limit == "nvme_unknown":
        return "[red]no[/red]: needs --nvme-path"
    if verdict.limit == "global_batch":
        return "[red]no[/red]: global batch"
    return f"[red]no[/red]: {_SHORT_LIMITS.get(verdict.limit, 'short by')} {format_bytes(verdict.shortfall_bytes)}"


def _row_cells(row: PlanRow) -> list[str]:
    estimate = row.estimate
    return [
        row.rung.value,
        "on" if row.grad_checkpointing else "off",
        str(row.micro_batch) if row.micro_batch else "-",
        format_bytes(estimate.gpu_peak_bytes),
        format_bytes(estimate.host_ram_bytes),
        format_bytes(estimate.nvme_bytes) if estimate.nvme_bytes else "-",
        _status(row),
    ]


def _components_line(row: PlanRow) -> str:
    parts = sorted(row.estimate.gpu_components.items(), key=lambda item: -abs(item[1]))
    listed = ", ".join(f"{name.replace('_', ' ')} {format_bytes(value)}" for name, value in parts)
    ckpt = "ckpt on" if row.grad_checkpointing else "ckpt off"
    return f"[bold]{row.rung.value}[/bold] {ckpt}, micro-batch {row.estimate.candidate.micro_batch}: {listed}"


def _print_modes(modes: ModeSummary, picked: bool = True) -> None:
    out = console()
    for line in modes.lines(picked):
        out.print(line, highlight=False, markup=False)


def _print_table(recommendation: Recommendation, modes: ModeSummary, verbose: bool) -> None:
    result = recommendation.plan
    settings = result.settings
    target = result.target
    title = (
        f"{result.model.name} ({result.model.total_params / 1e9:.2f}B params) on {target.describe()}: "
        f"seq {settings.seq_len}{_decoder(settings.decoder_seq_len)}, {settings.precision}, "
        f"{settings.attention} attention, optimizer {settings.optimizer}, {_kernels(settings.kernels)}"
        f"peak <= {result.headroom:.0%} of free"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("rung", max_width=14, overflow="fold")
    table.add_column("ckpt")
    table.add_column("mb", justify="right")
    on_cpu = target.gpu.key == "cpu"  # --device cpu: each rank is a process with its memory budget
    for column in ("peak/rank" if on_cpu else "GPU peak", "host/node", "NVMe/node"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("fits", min_width=16)
    for row in result.rows:
        cells = _row_cells(row)
        if row is recommendation.row:
            cells[-1] += " [bold](recommended)[/bold]"
        table.add_row(*cells)
    out = console()
    out.print(table)
    for note in _plan_notes(settings):
        out.print(f"Note: {note}.", highlight=False)
    if verbose:
        out.print(f"Components per {'CPU rank' if on_cpu else 'GPU'} (the micro-batch shown, or 1 when none fits):")
        for row in result.rows:
            out.print(_components_line(row))
        reasons = [row for row in result.rows if not row.micro_batch]
        if reasons:
            out.print("Why rungs do not fit:")
            for row in reasons:
                out.print(
                    f"[bold]{row.rung.value}[/bold] ckpt {'on' if row.grad_checkpointing else 'off'}: "
                    f"{row.verdict.reason}"
                )
    best = recommendation.row
    candidate = recommendation.candidate
    if best is None or candidate is None:
        tightest = min(result.rows, key=lambda r: r.verdict.shortfall_bytes)
        out.print(
            f"[bold red]Nothing fits.[/bold red] Closest: {tightest.rung.label}"
            f"{' with checkpointing' if tightest.grad_checkpointing else ''}: {tightest.verdict.reason}. "
            "Try more GPUs or nodes, a shorter --seq-len, or an --nvme-path for the NVMe rungs"
            f"{' (or a machine with more host RAM)' if any(r.verdict.limit == 'host' for r in result.rows) else ''}."
        )
        if hint := modes.nothing_fits_hint():
            out.print(f"No classic rung fits, but {hint}.", highlight=False)
        _print_modes(modes, picked=False)
        return
    from autotune.tuning.recommend import host_line, passed_over_line

    picked = recommendation.estimate or best.estimate
    out.print(
        f"Fastest predicted to fit (what plan-only `autotune` writes): "
        f"[bold]{candidate.rung.label}[/bold], micro-batch {candidate.micro_batch}, "
        f"gradient checkpointing {'on' if candidate.grad_checkpointing else 'off'}: "
        f"peak {format_bytes(picked.gpu_peak_bytes)} + margin {format_bytes(picked.gpu_margin_bytes)} "
        f"per {'CPU rank' if on_cpu else 'GPU'}."
    )
    if host := host_line(recommendation):
        out.print(f"  {host}.", highlight=False)
    if recommendation.passed_over is not None:
        out.print(f"  {passed_over_line(recommendation)}.", highlight=False)
    if recommendation.grid_note:
        out.print(f"  {recommendation.grid_note} (--micro-batches sets the grid).", highlight=False)
    _print_modes(modes)
    if not target.measured:
        out.print(
            "[dim]CUDA context, NCCL and allocator figures are published defaults; a tuning run calibrates "
            "them on the real GPUs.[/dim]"
        )


def _kernels(name: str) -> str:
    return "" if name == "stock" else f"{name} kernels, "


def _plan_notes(settings: EstimateSettings) -> list[str]:
    """What the prediction assumes beyond its table: the fused kernels counted, and a DeepSpeed other than the
    release the memory model was read in (core/versions.py)."""
    from autotune.core.versions import deepspeed_note
    from autotune.estimate.kernels import kernels_note

    return [note for note in (kernels_note(settings.kernels), deepspeed_note()) if note]


def _decoder(length: int | None) -> str:
    return f" (decoder {length})" if length else ""


def _config_answer(ctx: TuneContext, config: dict, grad_checkpointing: bool) -> ConfigFit:
    from autotune.check.fit import ConfigNotModelled, predict_config
    from autotune.errors import UserError

    request = ctx.request
    try:
        return predict_config(
            config,
            ctx.model,
            ctx.target,
            ctx.settings,
            grad_checkpointing=grad_checkpointing,
            headroom=request.search.headroom,
            micro_batch=request.search.micro_batch,
            global_batch=request.training.global_batch,
        )
    except ConfigNotModelled as why:
        hint = "; give --micro-batch" if why.micro_batch_unknown else ""
        raise UserError(f"--config {request.training.config}: {why}{hint}") from None


def _print_config_answer(ctx: TuneContext, fitted: ConfigFit) -> None:
    out = console()
    predicted, verdict, target = fitted.estimate, fitted.verdict, ctx.target
    verdict_text = "[bold green]fits[/bold green]" if verdict.fits else "[bold red]does not fit[/bold red]"
    settings = fitted.settings
    config, model = escape(str(ctx.request.training.config)), escape(ctx.model.name)  # paths may hold "[/]"
    out.print(
        f"{config}: {fitted.candidate.describe()} for {model}, seq {settings.seq_len}"
        f"{_decoder(settings.decoder_seq_len)}, {settings.precision}, optimizer {settings.optimizer}, "
        f"{_kernels(settings.kernels)}on {target.describe()}: {verdict_text}",
        highlight=False,
    )
    needed = predicted.gpu_peak_bytes + predicted.gpu_margin_bytes
    sign = "<=" if needed <= fitted.limit_bytes else ">"
    where = "per rank (host RAM, CPU backend)" if ctx.request.hardware.device == "cpu" else "GPU"
    out.print(
        f"  {where}: peak {format_bytes(predicted.gpu_peak_bytes)} + margin {format_bytes(predicted.gpu_margin_bytes)}"
        f" = {format_bytes(needed)} {sign} limit {format_bytes(fitted.limit_bytes)}"
        f" ({ctx.request.search.headroom:.0%} of {format_bytes(target.free_memory_bytes)} free)",
        highlight=False,
    )
    top = sorted((item for item in predicted.gpu_components.items() if item[1] > 0), key=lambda item: -item[1])[:4]
    out.print("  largest: " + ", ".join(f"{n.replace('_', ' ')} {format_bytes(v)}" for n, v in top), highlight=False)
    host = f"  host RAM: {format_bytes(predicted.host_ram_bytes)} per node"
    if fitted.pinned_host_bytes:
        host += f" ({format_bytes(fitted.pinned_host_bytes)} of it pinned)"
    if target.host_ram_bytes is None:
        host += ", not checked: host RAM not known (pass --host-memory)"
    else:
        host += f", limit {format_bytes(target.host_ram_bytes)}"
    if predicted.nvme_bytes:
        free = format_bytes(target.nvme_free_bytes) if target.nvme_free_bytes is not None else "unknown"
        host += f"; NVMe {format_bytes(predicted.nvme_bytes)} per node (free: {free})"
    out.print(host, highlight=False)
    if not verdict.fits:
        out.print(f"  why: {verdict.reason}", highlight=False, markup=False)
    for note in (*fitted.notes, *_overridden(ctx, fitted), *_plan_notes(settings)):
        out.print(f"  note: {note}", highlight=False, markup=False)


def _overridden(ctx: TuneContext, fitted: ConfigFit) -> list[str]:
    """Options the config's own values win over, said rather than silently ignored."""
    request, settings = ctx.request, fitted.settings
    notes = []
    if request.training.precision and request.training.precision != settings.precision:
        notes.append(
            f"the config's precision {settings.precision} is used, not --precision {request.training.precision}"
        )
    if request.training.optimizer != settings.optimizer and "optimizer" in (ctx.user_config or {}):
        notes.append(
            f"the config's optimizer ({settings.optimizer}) is used, not --optimizer {request.training.optimizer}"
        )
    return notes


def plan_command(
    model: ModelOpt,
    gpus: GpusOpt = D.hardware.gpus,
    nodes: NodesOpt = D.hardware.nodes,
    gpu_type: GpuTypeOpt = D.hardware.gpu_type,
    gpu_memory: GpuMemoryOpt = D.hardware.gpu_memory,
    device: DeviceOpt = D.hardware.device,
    memory_budget: MemoryBudgetOpt = D.hardware.memory_budget,
    gpu_memory_fraction: GpuMemoryFractionOpt = D.hardware.gpu_memory_fraction,
    seq_len: SeqLenOpt = D.model.seq_len,
    global_batch: GlobalBatchOpt = D.training.global_batch,
    precision: PrecisionOpt = D.training.precision,
    headroom: HeadroomOpt = D.search.headroom,
    attention: AttentionOpt = D.model.attention,
    max_micro_batch: MaxMicroBatchOpt = D.search.max_micro_batch,
    micro_batches: MicroBatchesOpt = None,
    rungs: RungsOpt = None,
    nvme_path: NvmePathOpt = D.hardware.nvme_path,
    trust_remote_code: TrustRemoteCodeOpt = D.model.trust_remote_code,
    allow_approximate: AllowApproximateOpt = D.search.allow_approximate,
    config: UserConfigOpt = D.training.config,
    micro_batch: MicroBatchOpt = D.search.micro_batch,
    optimizer: OptimizerOpt = D.training.optimizer,
    lora_rank: LoraRankOpt = D.model.lora_rank,
    lora_targets: LoraTargetsOpt = None,
    kernels: KernelsOpt = D.model.kernels,
    host_memory: HostMemoryOpt = D.hardware.host_memory,
    decoder_seq_len: DecoderSeqLenOpt = D.model.decoder_seq_len,
    grad_checkpointing: GradCkptOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show every memory component.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Predict memory for every ZeRO stage / offload rung: no GPU needed, nothing is run.

    With --config: whether that ds_config fits, as DeepSpeed would run it (the rule `check --model` uses).
    Exit codes: 0 something fits (--config: it fits), 2 bad input, 3 nothing fits (--config: it does not).
    """
    request = request_from_options("plan", locals())
    from autotune.request.context import TuneContext
    from autotune.tuning.recommend import mode_summary, recommend

    say_assumed_units(gpu_memory=gpu_memory, memory_budget=memory_budget, host_memory=host_memory)
    if grad_checkpointing is not None and not config:
        raise UserError("--grad-checkpointing/--no-grad-checkpointing apply to --config (the plan shows both)")
    ctx = TuneContext.build(request, outputs=False)
    if ctx.user_config is not None:
        fitted = _config_answer(ctx, ctx.user_config, bool(grad_checkpointing))
        if as_json:
            print_json(_config_json(ctx, fitted))
        else:
            _print_config_answer(ctx, fitted)
        if not fitted.verdict.fits:
            raise NothingFitsError(f"{config} does not fit {ctx.target.describe()}: {fitted.verdict.reason}")
        return
    recommendation = recommend(ctx)
    modes = mode_summary(ctx)
    if as_json:
        data = recommendation.plan.to_dict()
        row, candidate = recommendation.row, recommendation.candidate
        data["fastest_fit"] = {**row.to_dict(), "micro_batch": candidate.micro_batch} if row and candidate else None
        data["recommended"] = candidate.to_dict() if candidate else None
        data["recommended_estimate"] = recommendation.estimate.to_dict() if recommendation.estimate else None
        data["host_ram_known"] = not recommendation.host_unknown
        data["modes"] = modes.to_dict()
        data["notes"] = _plan_notes(ctx.settings)
        print_json(data)
    else:
        _print_table(recommendation, modes, verbose)
    if recommendation.candidate is None:
        hint = f"; but {clause}" if (clause := modes.nothing_fits_hint()) else ""
        raise NothingFitsError(f"nothing fits {ctx.target.describe()} (see the table for the closest rung){hint}")


def _config_json(ctx: TuneContext, fitted: ConfigFit) -> dict:
    return {
        "config": ctx.request.training.config,
        "fits": fitted.verdict.fits,
        "candidate": fitted.candidate.to_dict(),
        "target": ctx.target.to_dict(),
        "limit_bytes": fitted.limit_bytes,
        "pinned_host_bytes": fitted.pinned_host_bytes,
        "estimate": fitted.estimate.to_dict(),
        "verdict": {"fits": fitted.verdict.fits, "reason": fitted.verdict.reason, "limit": fitted.verdict.limit},
        "settings": asdict(fitted.settings),
        "notes": [*fitted.notes, *_overridden(ctx, fitted), *_plan_notes(fitted.settings)],
    }


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)
