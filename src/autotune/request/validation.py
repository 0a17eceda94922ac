"""`validate()`: every rule of a request that needs neither the model nor the hardware, checked before any work.

Bad input is one line and exit 2 here, before a probe, a model build or a trial. Beside the value rules it reads
what a request names (the base config, the training choices, the own command, the output paths), which is why it
lives apart from `TuneRequest`: those readers import the request type, the request type imports none of them.
"""

from __future__ import annotations

import math

from autotune.core.choices import ATTENTIONS, DEVICES, PRECISIONS
from autotune.errors import UserError
from autotune.request.tune_request import (
    MAX_MICRO_BATCH_LIMIT,
    TuneRequest,
    check_kernels,
    check_trial_workers,
    memory_size,
)


def _positive(value: float | None, flag: str, *, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if value is None or not math.isfinite(value) or value <= 0:
        raise UserError(f"{flag} must be a positive number, got {value}")


def _fraction(value: float | None, flag: str) -> None:
    if value is not None and (not math.isfinite(value) or not 0 < value <= 1):
        raise UserError(f"{flag} must be a fraction in (0, 1], got {value}")


def check_outputs(request: TuneRequest) -> None:
    """Output paths are checked before any work (infra/output_paths.py): regular files and directories on a writable,
    ordinary filesystem; no device, FIFO, /proc or /dev target, no symlink leading out of its directory or onto a
    file autotune did not write, and the same for every file written beside the config and the reports."""
    from autotune.infra.output_paths import vet_output_dir, vet_tuning_outputs

    vet_tuning_outputs(request.output.out, request.output.report_dir)
    if request.output.cache_dir and request.output.use_cache:
        vet_output_dir(request.output.cache_dir, "--cache-dir")


def validate(request: TuneRequest, *, outputs: bool = True) -> None:
    """Every rule that needs neither the model nor the hardware; raises UserError with one line.

    `outputs=False` for callers that write nothing (`check` re-building a tuning's context)."""
    if request.hardware.gpus is not None and request.hardware.gpus <= 0:
        raise UserError(f"--gpus must be positive (GPUs per node), got {request.hardware.gpus}")
    if request.hardware.nodes <= 0:
        raise UserError(f"--nodes must be positive, got {request.hardware.nodes}")
    if request.hardware.device not in DEVICES:
        raise UserError(f"--device must be one of {', '.join(DEVICES)}, got {request.hardware.device!r}")
    if request.training.precision not in (None, *PRECISIONS):
        raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, got {request.training.precision!r}")
    if request.model.attention not in ATTENTIONS:
        raise UserError(f"--attention must be one of {', '.join(ATTENTIONS)}, got {request.model.attention!r}")
    check_kernels(request.model.kernels, request.hardware.device)
    check_trial_workers(request)
    _fraction(request.search.headroom, "--headroom")
    _fraction(request.hardware.gpu_memory_fraction, "--gpu-memory-fraction")
    if request.model.seq_len is not None and request.model.seq_len <= 0:
        raise UserError(f"--seq-len must be positive, got {request.model.seq_len}")
    if request.model.decoder_seq_len is not None and request.model.decoder_seq_len <= 0:
        raise UserError(f"--decoder-seq-len must be positive, got {request.model.decoder_seq_len}")
    if request.search.micro_batch is not None and not 0 < request.search.micro_batch <= MAX_MICRO_BATCH_LIMIT:
        raise UserError(f"--micro-batch must be in 1..{MAX_MICRO_BATCH_LIMIT}, got {request.search.micro_batch}")
    if request.search.micro_batch is not None and request.search.micro_batches is not None:
        raise UserError("give --micro-batch (one, fixed) or --micro-batches (a grid), not both")
    if request.training.global_batch is not None and request.training.global_batch <= 0:
        raise UserError(f"--global-batch must be positive, got {request.training.global_batch}")
    if request.search.max_trials is not None and request.search.max_trials <= 0:
        raise UserError(f"--max-trials must be positive, got {request.search.max_trials}")
    if not 0 < request.search.max_micro_batch <= MAX_MICRO_BATCH_LIMIT:
        raise UserError(
            f"--max-micro-batch must be in 1..{MAX_MICRO_BATCH_LIMIT}, got {request.search.max_micro_batch}"
        )
    if request.search.micro_batches is not None and (
        not request.search.micro_batches
        or any(not 0 < m <= MAX_MICRO_BATCH_LIMIT for m in request.search.micro_batches)
    ):
        raise UserError(f"--micro-batches must be positive integers up to {MAX_MICRO_BATCH_LIMIT}")
    _positive(request.search.time_budget_s, "--time-budget")
    _positive(request.search.trial_timeout_s, "--trial-timeout", allow_none=False)
    if request.hardware.gpu_type and request.hardware.gpu_memory:
        raise UserError("give either --gpu-type or --gpu-memory, not both")
    if request.hardware.device == "cpu":
        for flag, value in (
            ("--gpu-type", request.hardware.gpu_type),
            ("--gpu-memory", request.hardware.gpu_memory),
            ("--gpu-memory-fraction", request.hardware.gpu_memory_fraction),
        ):
            if value is not None:
                raise UserError(f"{flag} has no meaning with --device cpu (use --memory-budget for the per-rank cap)")
    elif request.hardware.memory_budget is not None:
        raise UserError("--memory-budget applies to --device cpu; for GPUs use --gpu-memory-fraction or --gpu-memory")
    if request.training.tokens_per_step is not None and request.training.tokens_per_step <= 0:
        raise UserError(f"--tokens-per-step must be positive, got {request.training.tokens_per_step}")
    if request.training.base_config is not None and request.training.config is not None:
        raise UserError("give the config to tune on (tune/hook --config) or the config to answer for (plan), not both")
    if (
        request.training.base_config is not None
    ):  # read now: an unreadable base is one line before any coordination or trial
        from autotune.dsconfig.base_config import load_base

        load_base(request.training.base_config)
    if request.training.tokens_per_step is not None and request.training.global_batch is not None:
        raise UserError("give --global-batch or --tokens-per-step, not both")
    from autotune.training.checks import check_training_choices  # imports peft's helpers only when used

    check_training_choices(request.training.optimizer, request.model.lora_rank, request.training.script)
    if request.hardware.memory_budget is not None:
        memory_size(request.hardware.memory_budget, "--memory-budget")
    if request.hardware.gpu_memory is not None:
        memory_size(request.hardware.gpu_memory, "--gpu-memory")
    if request.hardware.host_memory is not None:
        if request.hardware.device == "cpu":
            raise UserError("--host-memory plans for another machine's GPUs; --device cpu uses this machine's RAM")
        memory_size(request.hardware.host_memory, "--host-memory")
    if request.training.consumer is not None and request.training.consumer not in ("hf", "deepspeed"):
        raise UserError(f"--consumer must be hf or deepspeed, not {request.training.consumer!r}")
    if request.training.consumer is not None and request.training.command is None:
        raise UserError("--consumer names what your own command runs; give the command after `--`")
    if request.training.command is not None:
        from autotune.request.own_command_mode import check_command  # imported only in own-command mode

        check_command(request)
    if outputs:
        check_outputs(request)
