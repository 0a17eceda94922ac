"""`autotune plan`: the memory model's prediction for every rung of the ladder, without running anything."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from autotune.cli.options import (
    AttentionOpt,
    D,
    GlobalBatchOpt,
    GpuMemoryOpt,
    GpusOpt,
    GpuTypeOpt,
    HeadroomOpt,
    JsonOpt,
    MaxMicroBatchOpt,
    MicroBatchesOpt,
    ModelOpt,
    NodesOpt,
    NvmePathOpt,
    PrecisionOpt,
    RungsOpt,
    SeqLenOpt,
    TrustRemoteCodeOpt,
    say_assumed_units,
)
from autotune.cli.output import console, print_json
from autotune.cli.parsing import parse_int_list, parse_rung_list
from autotune.errors import NothingFitsError
from autotune.estimate import PlanRow
from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.recommend import Recommendation

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


def _print_table(recommendation: Recommendation, verbose: bool) -> None:
    result = recommendation.plan
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
        cells = _row_cells(row)
        if row is recommendation.row:
            cells[-1] += " [bold](recommended)[/bold]"
        table.add_row(*cells)
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
    best = recommendation.row
    candidate = recommendation.candidate
    if best is None or candidate is None:
        tightest = min(result.rows, key=lambda r: r.verdict.shortfall_bytes)
        out.print(
            f"[bold red]Nothing fits.[/bold red] Closest: {tightest.rung.label}"
            f"{' with checkpointing' if tightest.grad_checkpointing else ''}: {tightest.verdict.reason}. "
            "Try more GPUs or nodes, a shorter --seq-len, or an --nvme-path for the NVMe rungs."
        )
        return
    out.print(
        f"Fastest predicted to fit (what plan-only `autotune` writes): "
        f"[bold]{candidate.rung.label}[/bold], micro-batch {candidate.micro_batch}, "
        f"gradient checkpointing {'on' if candidate.grad_checkpointing else 'off'} "
        f"(row peak {format_bytes(best.estimate.gpu_peak_bytes)} per GPU at micro-batch {best.micro_batch})."
    )
    if not target.measured:
        out.print(
            "[dim]CUDA context, NCCL and allocator figures are published defaults; a tuning run calibrates "
            "them on the real GPUs.[/dim]"
        )


def plan_command(
    model: ModelOpt,
    gpus: GpusOpt = D.gpus,
    nodes: NodesOpt = D.nodes,
    gpu_type: GpuTypeOpt = D.gpu_type,
    gpu_memory: GpuMemoryOpt = D.gpu_memory,
    seq_len: SeqLenOpt = D.seq_len,
    global_batch: GlobalBatchOpt = D.global_batch,
    precision: PrecisionOpt = D.precision,
    headroom: HeadroomOpt = D.headroom,
    attention: AttentionOpt = D.attention,
    max_micro_batch: MaxMicroBatchOpt = D.max_micro_batch,
    micro_batches: MicroBatchesOpt = None,
    rungs: RungsOpt = None,
    nvme_path: NvmePathOpt = D.nvme_path,
    trust_remote_code: TrustRemoteCodeOpt = D.trust_remote_code,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show every memory component.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Predict memory for every ZeRO stage / offload rung: no GPU needed, nothing is run.

    Exit codes: 0 something fits, 2 bad input, 3 nothing fits.
    """
    from autotune.context import TuneContext
    from autotune.recommend import recommend
    from autotune.request import TuneRequest

    request = TuneRequest(
        model=model,
        gpus=gpus,
        nodes=nodes,
        gpu_type=gpu_type,
        gpu_memory=gpu_memory,
        seq_len=seq_len,
        global_batch=global_batch,
        precision=precision,
        attention=attention,
        headroom=headroom,
        max_micro_batch=max_micro_batch,
        micro_batches=parse_int_list(micro_batches, "--micro-batches"),
        rungs=parse_rung_list(rungs),
        nvme_path=nvme_path,
        trust_remote_code=trust_remote_code,
    )
    say_assumed_units(gpu_memory=gpu_memory)
    ctx = TuneContext.build(request, outputs=False)
    recommendation = recommend(ctx)
    if as_json:
        data = recommendation.plan.to_dict()
        row, candidate = recommendation.row, recommendation.candidate
        data["fastest_fit"] = {**row.to_dict(), "micro_batch": candidate.micro_batch} if row and candidate else None
        data["recommended"] = candidate.to_dict() if candidate else None
        print_json(data)
    else:
        _print_table(recommendation, verbose)
    if recommendation.candidate is None:
        raise NothingFitsError(f"nothing fits {ctx.target.describe()} (see the table for the closest rung)")


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)
