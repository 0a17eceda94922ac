"""`autotune check CONFIG`: what a DeepSpeed config really does, and --fix to correct it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from autotune.check import CheckReport, Severity, check_config, resolve_context
from autotune.cli.options import GpuMemoryOpt, GpusOpt, GpuTypeOpt, JsonOpt, NodesOpt, SeqLenOpt, TrustRemoteCodeOpt
from autotune.cli.output import console, print_json

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}

ConfigArg = Annotated[Path, typer.Argument(help="ds_config.json (JSON or hjson), as passed to DeepSpeed.")]
CheckModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="Also predict this config's per-GPU peak for this model.")
]
EnvFileOpt = Annotated[
    Path | None, typer.Option("--env-file", help="Job script or env list: flag variables no one reads.")
]
FixOpt = Annotated[
    Path | None, typer.Option("--fix", help="Write a corrected config here (only if DeepSpeed accepts it).")
]
HfOpt = Annotated[bool, typer.Option("--hf", help='The config is for the HF Trainer, which fills "auto".')]
GradCkptOpt = Annotated[
    bool, typer.Option("--grad-checkpointing", help="The model uses gradient checkpointing (for the fit check).")
]


def _counted(count: int, severity: Severity) -> str:
    plural = "s" if count != 1 and severity is not Severity.INFO else ""
    return f"{count} {severity.value}{plural}"


def _print_report(report: CheckReport) -> None:
    out = console()
    table = Table(
        title=f"autotune check: {report.config_path}",
        caption=f"world size {report.world_size} ({report.world_size_source})",
        expand=True,
    )
    table.add_column("severity", no_wrap=True)
    table.add_column("key", overflow="fold", ratio=3)
    table.add_column("finding", overflow="fold", ratio=6)
    table.add_column("--fix", overflow="fold", ratio=3)
    for finding in report.findings:
        table.add_row(
            f"[{_STYLE[finding.severity]}]{finding.severity.value}[/]",
            finding.path or "(config)",
            finding.message,
            finding.fix.description if finding.fix else "",
        )
    if report.findings:
        out.print(table)
    counts = ", ".join(_counted(report.count(severity), severity) for severity in Severity)
    out.print(f"{report.config_path}: {counts}" if report.findings else f"{report.config_path}: no findings")
    if report.fix is not None:
        _print_fix(report)


def _print_fix(report: CheckReport) -> None:
    out = console()
    fix = report.fix
    if not fix.written:
        out.print(f"[bold red]Not written[/]: DeepSpeed still rejects the fixed config: {fix.rejected_by_deepspeed}")
    elif fix.changes:
        out.print(f"Wrote {fix.output_path} with {len(fix.changes)} change(s):")
    else:
        out.print(f"Wrote {fix.output_path}: nothing to change.")
    for change in fix.changes:
        out.print(f"  - {change}")
    for finding in fix.remaining:
        out.print(f"  [{_STYLE[finding.severity]}]left for you[/] {finding.path or '(config)'}: {finding.message}")


def check_command(
    config: ConfigArg,
    gpus: GpusOpt = None,
    nodes: NodesOpt = 1,
    gpu_type: GpuTypeOpt = None,
    gpu_memory: GpuMemoryOpt = None,
    model: CheckModelOpt = None,
    seq_len: SeqLenOpt = 2048,
    grad_checkpointing: GradCkptOpt = False,
    env_file: EnvFileOpt = None,
    fix: FixOpt = None,
    hf: HfOpt = False,
    trust_remote_code: TrustRemoteCodeOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Check a DeepSpeed config against what DeepSpeed really does with it.

    Exit code: 0 no errors, 1 errors (with --fix: errors left in the written config), 2 unreadable input.
    """
    from autotune.check import load_config

    load_config(config)  # an unreadable config fails first, before any probing
    context = resolve_context(gpus, nodes, gpu_type, gpu_memory, for_hf_trainer=hf)
    summary = None
    if model:
        from autotune.models import resolve_model, summarize

        summary = summarize(resolve_model(model, trust_remote_code))
    report = check_config(config, context, env_file, summary, seq_len, grad_checkpointing, fix)
    if as_json:
        print_json(report.to_dict())
    else:
        _print_report(report)
    raise typer.Exit(report.exit_code())


def register(app: typer.Typer) -> None:
    app.command("check")(check_command)
