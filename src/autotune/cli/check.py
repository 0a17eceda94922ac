"""`autotune check CONFIG`: what a DeepSpeed config really does, and --fix to correct it."""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from autotune.check import CheckReport, Severity, check_config, resolve_context
from autotune.check.findings import FixResult
from autotune.cli import click_errors
from autotune.cli.options import (
    D,
    GpuMemoryOpt,
    GpusOpt,
    GpuTypeOpt,
    GradCkptOpt,
    JsonOpt,
    KernelsOpt,
    NodesOpt,
    SeqLenOpt,
    TrustRemoteCodeOpt,
)
from autotune.cli.output import console, print_json
from autotune.cli.request import recorded_options, request_from_given
from autotune.core.choices import Kernels
from autotune.core.versions import read_against_note
from autotune.request.tune_request import TuneRequest

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
HfOpt = Annotated[bool, typer.Option("--hf", help="Same as --consumer hf-trainer.")]
ConsumerOpt = Annotated[
    str,
    typer.Option(
        "--consumer",
        help='Who reads the config: deepspeed, hf-trainer, accelerate, or auto (HF Trainer when it has "auto" '
        "values, accelerate for an accelerate YAML, else deepspeed).",
    ),
]
FixTrainingOpt = Annotated[
    bool,
    typer.Option(
        "--fix-training",
        help="Let --fix also change training values (batch sizes, optimizer, lr, precision, clipping).",
    ),
]
InitCheckOpt = Annotated[
    bool,
    typer.Option(
        "--init-check",
        help="Also run deepspeed.initialize and one step on a tiny model (CPU backend, world size 1, batch keys "
        "scaled): catches what only the engine refuses. 10-60 s; a first run may build DeepSpeed's CPU Adam.",
    ),
]
_CONSUMERS = ("auto", "deepspeed", "hf-trainer", "accelerate")


def _counted(count: int, severity: Severity) -> str:
    plural = "s" if count != 1 and severity is not Severity.INFO else ""
    return f"{count} {severity.value}{plural}"


def _print_report(report: CheckReport) -> None:
    out = console()
    out.print(f"checked against DeepSpeed {report.deepspeed_version}; {report.consumer_reason}", markup=False)
    if note := read_against_note(report.deepspeed_version or None):
        out.print(f"note: {note}", markup=False, highlight=False)
    table = Table(
        title=f"autotune check: {escape(str(report.config_path))}",
        caption=f"world size {report.world_size} ({report.world_size_source}), DeepSpeed {report.deepspeed_version}",
        expand=True,
    )
    table.add_column("severity", no_wrap=True)
    table.add_column("key", overflow="fold", ratio=3)
    table.add_column("finding", overflow="fold", ratio=6)
    table.add_column("--fix", overflow="fold", ratio=3)
    for finding in report.findings:
        table.add_row(
            f"[{_STYLE[finding.severity]}]{finding.severity.value}[/]",
            escape(finding.path or "(config)"),  # keys and values are the config's: "[/]" is text here
            escape(finding.message),
            escape(finding.fix.description) if finding.fix else "",
        )
    if report.findings:
        out.print(table)
    counts = ", ".join(_counted(report.count(severity), severity) for severity in Severity)
    summary = f"{report.config_path}: {counts}" if report.findings else f"{report.config_path}: no findings"
    out.print(summary, markup=False)
    if report.fix is not None:
        _print_fix(report.fix)


def _print_fix(fix: FixResult) -> None:
    out = console()
    if not fix.written:
        out.print(
            f"[bold red]Not written[/] ({escape(str(fix.output_path))} left as it was): the fixed config is still"
            f" refused: {escape(str(fix.rejected_by_deepspeed))}"
        )
    elif fix.changes:
        out.print(f"Wrote {fix.output_path} with {len(fix.changes)} change(s):", markup=False)
    else:
        out.print(f"Wrote {fix.output_path}: nothing to change.", markup=False)
    for change in fix.changes:
        out.print(f"  - {change}", markup=False)
    for withheld in fix.withheld:
        out.print(f"  [yellow]not applied[/] (changes training; --fix-training applies it) {escape(str(withheld))}")
    for finding in fix.remaining:
        where = escape(finding.path or "(config)")
        out.print(f"  [{_STYLE[finding.severity]}]left for you[/] {where}: {escape(finding.message)}")


def check_command(
    config: ConfigArg,
    gpus: GpusOpt = None,
    nodes: NodesOpt = D.hardware.nodes,
    gpu_type: GpuTypeOpt = None,
    gpu_memory: GpuMemoryOpt = None,
    model: CheckModelOpt = None,
    seq_len: SeqLenOpt = None,
    grad_checkpointing: GradCkptOpt = None,
    env_file: EnvFileOpt = None,
    fix: FixOpt = None,
    fix_training: FixTrainingOpt = False,
    hf: HfOpt = False,
    consumer: ConsumerOpt = "auto",
    init_check: InitCheckOpt = False,
    trust_remote_code: TrustRemoteCodeOpt = False,
    kernels: KernelsOpt = D.model.kernels,
    as_json: JsonOpt = False,
) -> None:
    """Check a DeepSpeed config against what DeepSpeed really does with it.

    A config written by autotune has a `<name>.autotune.json` beside it saying what the tuning assumed (model,
    sequence length, checkpointing, precision, hardware); options not given here are taken from it, so
    checking the tuner's own output asks the tuner's question.

    Exit code: 0 no errors, 1 errors (with --fix: errors left in the written config, or nothing written),
    2 unreadable input, or check itself could not run (one line: a missing dependency, a crash).
    """
    from autotune.check import load_config
    from autotune.errors import UserError
    from autotune.report.assumptions import read_assumptions

    if consumer not in _CONSUMERS:
        raise UserError(f"--consumer must be one of {', '.join(_CONSUMERS)}, not {consumer!r}")
    if hf and consumer not in ("auto", "hf-trainer"):
        raise UserError(f"--hf contradicts --consumer {consumer}")
    from autotune.request.tune_request import check_kernels

    kernel_set = check_kernels(kernels)
    load_config(config)  # an unreadable config fails first, before any probing
    if fix is not None:
        _check_fix_output(fix)
    requested = "hf-trainer" if hf else (None if consumer == "auto" else consumer)
    options = CheckOptions(env_file, fix, fix_training, init_check)
    recorded = read_assumptions(config)
    hardware_given = gpus is not None or gpu_type is not None or gpu_memory is not None
    if recorded and not model and not hardware_given:
        report = _check_as_tuned(
            config,
            recorded,
            seq_len,
            grad_checkpointing,
            hf=hf,
            consumer=requested,
            options=options,
            kernels=kernel_set,
        )
    else:
        context = resolve_context(gpus, nodes, gpu_type, gpu_memory, for_hf_trainer=hf, consumer=requested)
        summary = None
        if model:
            from autotune.models import resolve_model, summarize
            from autotune.request.tune_request import default_seq_len

            summary = summarize(resolve_model(model, trust_remote_code))
            relative = "relative_attention_num_buckets" in summary.config
            seq_len = seq_len or default_seq_len(None if relative else summary.max_positions)
        from autotune.check.fit import FitAssumptions

        assumed = FitAssumptions(kernels=kernel_set) if kernel_set != D.model.kernels else None  # otherwise as before
        report = check_config(
            config,
            context,
            env_file,
            summary,
            seq_len=seq_len or 0,
            grad_checkpointing=bool(grad_checkpointing),
            fix_output=fix,
            allow_training_changes=fix_training,
            init_check=init_check,
            assumed=assumed,
        )
    if as_json:
        print_json(report.to_dict())
    else:
        _print_report(report)
    raise typer.Exit(report.exit_code())


def _check_fix_output(output: Path) -> None:
    """Refuse an output path that can never be written, before any work: one line, exit 2 (infra/output_paths.py)."""
    from autotune.infra.output_paths import vet_output_file

    vet_output_file(output, "--fix output")


@dataclass(frozen=True)
class CheckOptions:
    """What the user asked of the check besides the config and the hardware: passed through unchanged."""

    env_file: Path | None
    fix: Path | None
    fix_training: bool
    init_check: bool


def request_as_recorded(recorded: dict[str, Any], seq_len: int | None) -> TuneRequest:
    """The tuning's own request, read back from the assumptions it recorded beside its config through the mapping
    every command builds its request with (cli/request.py): what the record lacks takes `TuneRequest`'s default,
    so no default is restated here; `seq_len` (check's --seq-len) overrides the recorded one."""
    options = recorded_options(recorded)
    if seq_len:
        options["seq_len"] = seq_len
    return request_from_given(options)


def _check_as_tuned(
    config: Path,
    recorded: dict,
    seq_len: int | None,
    grad_checkpointing: bool | None,
    hf: bool,
    consumer: str | None,
    options: CheckOptions,
    kernels: Kernels = D.model.kernels,
) -> CheckReport:
    """Check against the tuning's own context: the same model, target, precision and sequence length."""
    from autotune.check import CheckContext
    from autotune.check.fit import FitAssumptions
    from autotune.request.context import TuneContext

    request = request_as_recorded(recorded, seq_len)
    ctx = TuneContext.build(request, outputs=False)
    target = ctx.target
    context = CheckContext(
        world_size=target.world_size,
        world_size_source=f"{target.gpus_per_node} x {target.nodes}, as the tuning recorded",
        bf16_capable=target.gpu.bf16 if target.gpu.key not in ("custom",) else None,
        target=target,
        for_hf_trainer=hf,
        consumer=consumer,
    )
    ckpt = grad_checkpointing if grad_checkpointing is not None else bool(recorded.get("grad_checkpointing"))
    assumed = FitAssumptions(
        attention=ctx.request.model.attention,
        device=request.hardware.device,
        headroom=ctx.request.search.headroom,
        measured_peak_bytes=recorded.get("measured_peak_bytes") if recorded.get("verified") else None,
        optimizer=ctx.request.training.optimizer,
        decoder_seq_len=ctx.decoder_seq_len,
        kernels=kernels if kernels != D.model.kernels else request.model.kernels,  # check's --kernels, else as recorded
    )
    return check_config(
        config,
        context,
        options.env_file,
        ctx.model,
        seq_len=ctx.seq_len,
        grad_checkpointing=ckpt,
        fix_output=options.fix,
        allow_training_changes=options.fix_training,
        init_check=options.init_check,
        assumed=assumed,
    )


def _own_failure_exits_2(command: Callable[..., None]) -> Callable[..., None]:
    """check's own crash is one line and exit 2, never a traceback with exit 1: 1 means findings, and a CI gate
    must tell the two apart."""

    @functools.wraps(command)
    def guarded(*args: Any, **kwargs: Any) -> None:
        from autotune.errors import UserError

        try:
            command(*args, **kwargs)
        except (UserError, typer.Exit, typer.Abort, click_errors.ClickException):
            raise
        except Exception as error:
            frame = traceback.extract_tb(error.__traceback__)[-1]
            where = f"{Path(frame.filename).name}:{frame.lineno}"
            raise UserError(
                f"check itself failed ({type(error).__name__} at {where}: {error}); this says nothing about the config"
            ) from error

    return guarded


def register(app: typer.Typer) -> None:
    app.command("check")(_own_failure_exits_2(check_command))
