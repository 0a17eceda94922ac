"""`autotune hook`: the pre-launch hook for SLURM and torchrun jobs.

stdout carries only what a script consumes (the config path, the `export AUTOTUNE_...=` lines of
autotune.hook.handoff for `eval`, or JSON); progress and warnings go to stderr, so
`eval "$(autotune hook ... --print-env)"` stays safe.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from autotune.cli.options import (
    AllowApproximateOpt,
    AttentionOpt,
    BaseConfigOpt,
    D,
    DecoderSeqLenOpt,
    DeviceOpt,
    GlobalBatchOpt,
    HeadroomOpt,
    JsonOpt,
    KernelsOpt,
    LoraRankOpt,
    LoraTargetsOpt,
    MaxMicroBatchOpt,
    MaxTrialsOpt,
    MemoryBudgetOpt,
    MicroBatchesOpt,
    ModelOpt,
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
from autotune.cli.output import err_console, print_json, stamped
from autotune.cli.request import request_from_options
from autotune.cli.tune import TrialProgress
from autotune.errors import UserError
from autotune.hook.handoff import hook_handoff
from autotune.hook.outputs import published_report
from autotune.infra.terminate import sigterm_raises
from autotune.report.pick import measurement_lines, summary_head

if TYPE_CHECKING:
    from autotune.hook import HookResult

_BANNER = "!" * 100


def _warn_loudly(result: HookResult) -> None:
    record = result.record
    kind = "NOT VERIFIED: plan-only" if not record.verified else "best verified so far, tuning incomplete"
    lines = [
        _BANNER,
        f"autotune hook WARNING: fallback config ({kind})",
        f"  {record.warning}",
        f"  written to {result.config_path}",
        "  pass --strict to fail the job instead of training with it",
        _BANNER,
    ]
    print("\n".join(lines), file=sys.stderr)


def _summary(result: HookResult, verbose: bool = False) -> str:
    """The head `tune` prints (pick, speed with its interval, runner-up or tie, memory, host) when the record
    carries the tuning's report, then the hook's own line: who tuned, the config and its hash."""
    record = result.record
    details = record.details
    how = {"leader": "tuned here", "follower": f"tuned by {record.leader}", "hit": "published result"}[result.role]
    trials = f", {details['trials_launched']} trial(s)" if details.get("trials_launched") else ""
    choice = f": {details['choice']}" if details.get("choice") else ""
    hook_line = (
        f"autotune hook: {result.job.describe()}; {how} ({record.source}{trials}{choice});"
        f" config {result.config_path} (sha256 {(record.config_sha256 or '')[:16]}) in {result.elapsed_s:.1f} s"
        + (f"; report {result.report_path}" if result.report_path else "")
    )
    report = published_report(details.get("outputs") or {})
    handoff = hook_handoff(result)
    # in a batch log this is what the user reads: the world size, what each rank runs, and the notes
    tail = [f"  {handoff.world_line()}", *(f"  train: {line}" for line in handoff.rank_lines())]
    tail += [f"  note: {note}" for note in (report.notes if report else [])]
    if report is None or report.choice is None:
        return "\n".join([hook_line, *tail])
    headline, *lead = summary_head(report, record.verified, bool(details.get("from_cache")))
    lead += measurement_lines(report) if verbose else []
    return "\n".join([headline, *(f"  {line}" for line in lead), hook_line, *tail])


def _say(line: str) -> None:
    print(stamped(f"hook: {line}"), file=sys.stderr, flush=True)


def hook_command(
    model: ModelOpt,
    out: OutOpt = D.output.out,
    cache_dir: Annotated[
        str | None,
        typer.Option(
            help="Directory every node sees: lock, published result, results cache (default: ~/.cache/autotune)."
        ),
    ] = D.output.cache_dir,
    time_budget: Annotated[
        float | None,
        typer.Option(help="Seconds of tuning (no trial runs longer); then the best verified config so far is used."),
    ] = D.search.time_budget_s,
    strict: Annotated[
        bool, typer.Option("--strict", help="Fail instead of writing a fallback (unverified or incomplete) config.")
    ] = False,
    wait_timeout: Annotated[
        float | None, typer.Option(help="Seconds a waiting process waits for the tuner (default 1 h, or 2x budget).")
    ] = None,
    print_env: Annotated[
        bool,
        typer.Option(
            "--print-env",
            help="Print `export AUTOTUNE_DS_CONFIG=... AUTOTUNE_HF_CONFIG=... AUTOTUNE_HF_ARGS=..."
            " AUTOTUNE_WORLD_SIZE=...` for eval (docs/cluster.md).",
        ),
    ] = False,
    device: DeviceOpt = D.hardware.device,
    gpus: Annotated[int | None, typer.Option("--gpus", "-g", help="GPUs per node, when the job does not say.")] = None,
    nodes: Annotated[int | None, typer.Option("--nodes", "-n", help="Nodes, when the job does not say.")] = None,
    nodelist: Annotated[
        str | None, typer.Option(help="Hosts of the job outside SLURM, SLURM syntax allowed: node[01-04].")
    ] = None,
    memory_budget: MemoryBudgetOpt = D.hardware.memory_budget,
    seq_len: SeqLenOpt = D.model.seq_len,
    decoder_seq_len: DecoderSeqLenOpt = D.model.decoder_seq_len,
    global_batch: GlobalBatchOpt = D.training.global_batch,
    precision: PrecisionOpt = D.training.precision,
    attention: AttentionOpt = D.model.attention,
    headroom: HeadroomOpt = D.search.headroom,
    max_trials: MaxTrialsOpt = D.search.max_trials,
    max_micro_batch: MaxMicroBatchOpt = D.search.max_micro_batch,
    micro_batches: MicroBatchesOpt = None,
    rungs: RungsOpt = None,
    nvme_path: NvmePathOpt = D.hardware.nvme_path,
    trial_timeout: TrialTimeoutOpt = D.search.trial_timeout_s,
    report_dir: ReportDirOpt = D.output.report_dir,
    trust_remote_code: TrustRemoteCodeOpt = D.model.trust_remote_code,
    allow_approximate: AllowApproximateOpt = D.search.allow_approximate,
    trial_workers: TrialWorkersOpt = D.search.trial_workers,
    base_config: BaseConfigOpt = D.training.base_config,
    optimizer: OptimizerOpt = D.training.optimizer,
    lora_rank: LoraRankOpt = D.model.lora_rank,
    lora_targets: LoraTargetsOpt = None,
    kernels: KernelsOpt = D.model.kernels,
    consumer: OwnConsumerOpt = None,
    as_json: JsonOpt = False,
    verbose: VerboseOpt = False,
    command: UserCommandArg = None,
) -> None:
    """Pre-launch hook: tune once per job (one process tunes, the others wait) and write ds_config.json."""
    options = dict(locals())  # before anything else is bound: the request is read from these (cli/request.py)
    from autotune.hook import HookRequest, JobOverrides, run_hook
    from autotune.request.validation import validate

    if print_env and as_json:
        raise UserError("give --print-env or --json, not both")
    tuning = request_from_options("hook", options)
    say_assumed_units(memory_budget=memory_budget)
    validate(tuning)  # bad input is one line and exit 2 here, before any coordination or tuning
    if wait_timeout is not None and not (wait_timeout > 0 and wait_timeout != float("inf")):
        raise UserError(f"--wait-timeout must be a positive number of seconds, got {wait_timeout}")
    if cache_dir is not None:  # the shared directory every node sees: vetted like tune's --cache-dir
        from autotune.infra.output_paths import vet_output_dir

        if Path(cache_dir).exists() and not Path(cache_dir).is_dir():
            raise UserError(f"--cache-dir {cache_dir} is a file; it names a directory every node sees")
        vet_output_dir(cache_dir, "--cache-dir")
    request = HookRequest(
        tuning=tuning,
        shared_dir=cache_dir,
        overrides=JobOverrides(gpus=gpus, nodes=nodes, nodelist=nodelist),
        wait_timeout_s=wait_timeout,
        strict=strict,
    )
    # SIGTERM (scancel, time limit): trials stopped, best verified config published, exit 143 (infra/terminate.py);
    # a HookError (exit 4) reaches the CLI's one handler like every other AutotuneError
    with sigterm_raises():
        budget = tuning.search.time_budget_s
        progress = TrialProgress(err_console(), max_trials, enabled=True, verbose=verbose, time_budget_s=budget)
        result = run_hook(request, observe=progress, say=_say)
    if result.ignored:
        print(f"autotune hook: did not trust a published result ({result.ignored})", file=sys.stderr)
    if result.fallback:
        _warn_loudly(result)
    print(_summary(result, verbose), file=sys.stderr)
    if as_json:
        print_json(result.to_dict())
    elif print_env:
        print("\n".join(hook_handoff(result).exports()))
    else:
        print(result.config_path)


def register(app: typer.Typer) -> None:
    app.command("hook")(hook_command)
