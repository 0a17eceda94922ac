"""`autotune plan`: the memory model's prediction for every rung of the ladder, without running anything."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

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
from autotune.cli.output import console, print_json
from autotune.errors import UserError
from autotune.estimate import EstimateSettings, Plan, PlanRow, plan
from autotune.hardware import Target
from autotune.models import ModelSummary, resolve_model, summarize
from autotune.units import format_bytes

ATTENTION_CHOICES = ("sdpa", "flash", "eager")
PRECISION_CHOICES = ("bf16", "fp16", "fp32")


def default_seq_len(model: ModelSummary) -> int:
    """The model's context, capped at 2048; relative-position models (T5) were pre-trained at 512."""
    if model.max_positions:
        return min(2048, int(model.max_positions))
    return 512


def _check_inputs(
    seq_len: int | None, headroom: float, attention: str, precision: str | None, global_batch: int | None
) -> None:
    if seq_len is not None and seq_len <= 0:
        raise UserError(f"--seq-len must be positive, got {seq_len}")
    if not 0 < headroom <= 1:
        raise UserError(f"--headroom must be a fraction in (0, 1], got {headroom}")
    if attention not in ATTENTION_CHOICES:
        raise UserError(f"--attention must be one of {', '.join(ATTENTION_CHOICES)}, got {attention!r}")
    if precision is not None and precision not in PRECISION_CHOICES:
        raise UserError(f"--precision must be one of {', '.join(PRECISION_CHOICES)}, got {precision!r}")
    if global_batch is not None and global_batch <= 0:
        raise UserError(f"--global-batch must be positive, got {global_batch}")


def _target(
    gpus: int | None, nodes: int, gpu_type: str | None, gpu_memory: str | None, nvme_path: str | None
) -> Target:
    """Profile flags plan for elsewhere (this machine is probed only for an NVMe path); else probe here."""
    from autotune.probe import probe
    from autotune.target import resolve_target

    planned = bool(gpu_type or gpu_memory)
    probed = probe(nvme_path) if not planned or nvme_path else None
    return resolve_target(probed, gpus, nodes, gpu_type, gpu_memory)


def fastest_fit(result: Plan) -> PlanRow | None:
    """Rows are in expected-speed order, checkpointing off first: the first that fits is the pick."""
    fitting = result.fitting_rows
    return fitting[0] if fitting else None


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


def _print_table(result: Plan, verbose: bool) -> None:
    settings = result.settings
    target = result.target
    title = (
        f"{result.model.name} ({result.model.total_params / 1e9:.2f}B params) on {target.describe()}: "
        f"seq {settings.seq_len}, {settings.precision}, {settings.attention} attention, "
        f"peak <= {result.headroom:.0%} of free"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("rung", max_width=14, overflow="fold")
    table.add_column("ckpt")
    table.add_column("mb", justify="right")
    for column in ("GPU peak", "host/node", "NVMe/node"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("fits", min_width=16)
    for row in result.rows:
        table.add_row(*_row_cells(row))
    out = console()
    out.print(table)
    if verbose:
        out.print("Components per GPU (the micro-batch shown, or 1 when none fits):")
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
    best = fastest_fit(result)
    if best is None:
        tightest = min(result.rows, key=lambda r: r.verdict.shortfall_bytes)
        out.print(
            f"[bold red]Nothing fits.[/bold red] Closest: {tightest.rung.label}"
            f"{' with checkpointing' if tightest.grad_checkpointing else ''}: {tightest.verdict.reason}. "
            "Try more GPUs or nodes, a shorter --seq-len, or an --nvme-path for the NVMe rungs."
        )
        return
    out.print(
        f"Fastest predicted to fit: [bold]{best.rung.label}[/bold], micro-batch {best.micro_batch}, "
        f"gradient checkpointing {'on' if best.grad_checkpointing else 'off'} "
        f"({format_bytes(best.estimate.gpu_peak_bytes)} per GPU)."
    )
    if not target.measured:
        out.print(
            "[dim]CUDA context, NCCL and allocator figures are published defaults; a tuning run calibrates "
            "them on the real GPUs.[/dim]"
        )


def plan_command(
    model: ModelOpt,
    gpus: GpusOpt = None,
    nodes: NodesOpt = 1,
    gpu_type: GpuTypeOpt = None,
    gpu_memory: GpuMemoryOpt = None,
    seq_len: Annotated[
        int | None, typer.Option("--seq-len", "-s", help="Sequence length (default: the model's, at most 2048).")
    ] = None,
    global_batch: GlobalBatchOpt = None,
    precision: PrecisionOpt = None,
    headroom: Annotated[float, typer.Option(help="Peak must stay under this fraction of free memory.")] = 0.9,
    attention: Annotated[str, typer.Option(help="Attention implementation: sdpa, flash or eager.")] = "sdpa",
    nvme_path: NvmePathOpt = None,
    trust_remote_code: TrustRemoteCodeOpt = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show every memory component.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Predict memory for every ZeRO stage / offload rung: no GPU needed, nothing is run."""
    _check_inputs(seq_len, headroom, attention, precision, global_batch)
    source = resolve_model(model, trust_remote_code)
    target = _target(gpus, nodes, gpu_type, gpu_memory, nvme_path)  # before the summary: fail fast without a GPU
    summary = summarize(source)
    length = seq_len or default_seq_len(summary)
    if summary.max_positions and length > summary.max_positions:
        raise UserError(f"--seq-len {length} exceeds the model's {summary.max_positions} positions")
    chosen_precision = precision or ("bf16" if target.gpu.bf16 else "fp16")
    settings = EstimateSettings(seq_len=length, precision=chosen_precision, attention=attention, device="cuda")
    result = plan(summary, target, settings, headroom, global_batch)
    if as_json:
        data = result.to_dict()
        best = fastest_fit(result)
        data["fastest_fit"] = best.to_dict() if best else None
        print_json(data)
        return
    _print_table(result, verbose)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)
