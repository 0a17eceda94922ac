"""Options shared by several commands, declared once; their defaults come from `TuneRequest`.

A command writes `headroom: HeadroomOpt = D.search.headroom`, so `--headroom` has one meaning and one default
in `tune`, `plan` and `hook`; cli/request.py turns a command's options into its `TuneRequest`.
"""

from __future__ import annotations

import math
import sys
from typing import Annotated

import typer

from autotune.core.choices import ATTENTIONS, DEVICES, KERNELS, PRECISIONS
from autotune.request.tune_request import TuneRequest


def _choices(values: tuple[str, ...]) -> str:
    return "[" + "|".join(values) + "]"


def _gpu_types_help() -> str:
    from autotune.hardware.specs import gpu_types

    return ", ".join(spec.key for spec in gpu_types())


D = TuneRequest.of(model="")  # the defaults, read by section and attribute: `= D.search.headroom`

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="Built-in profile, local HF dir / config.json, or cached hub id.")
]
GpusOpt = Annotated[
    int | None,
    typer.Option("--gpus", "-g", help="GPUs per node (default: all visible; with --device cpu: CPU ranks, default 1)."),
]
NodesOpt = Annotated[int, typer.Option("--nodes", "-n", help="Number of nodes.")]
GpuTypeOpt = Annotated[
    str | None,
    typer.Option("--gpu-type", help=f"Plan for this accelerator profile, one of: {_gpu_types_help()}."),
]
GpuMemoryOpt = Annotated[
    str | None,
    typer.Option(
        "--gpu-memory", help="Plan for a GPU with this much memory, e.g. 80GiB or 24GB; a bare number is GiB."
    ),
]
DeviceOpt = Annotated[
    str,
    typer.Option(
        metavar=_choices(DEVICES),
        help="cuda: the GPUs here; cpu: the CPU backend (DS_ACCELERATOR=cpu), one process per rank.",
    ),
]
MemoryBudgetOpt = Annotated[
    str | None,
    typer.Option(help="Per-rank memory cap for --device cpu, e.g. 2GiB (a bare number is GiB; default: RAM / ranks)."),
]
SeqLenOpt = Annotated[
    int | None,
    typer.Option("--seq-len", "-s", help="Sequence length in tokens (default: the model's, at most 2048; T5: 512)."),
]
GlobalBatchOpt = Annotated[int | None, typer.Option("--global-batch", help="Effective batch to keep fixed (samples).")]
PrecisionOpt = Annotated[
    str | None,
    typer.Option(
        "--precision",
        metavar=_choices(PRECISIONS),
        help="Default: bf16 where the device computes it natively, else fp16 on GPUs and fp32 on the CPU backend.",
    ),
]
AttentionOpt = Annotated[str, typer.Option(metavar=_choices(ATTENTIONS), help="Attention implementation.")]
KernelsOpt = Annotated[
    str,
    typer.Option(
        metavar=_choices(KERNELS),
        help="Fused training kernels your training uses: liger (HF use_liger_kernel=True: fused RMSNorm, SwiGLU,"
        " RoPE, linear cross-entropy) or flash-attn-fused (flash-attn's RMSNorm, cross-entropy and rotary, xformers'"
        " SwiGLU); they keep fewer activations than transformers' own modules.",
    ),
]
OwnConsumerOpt = Annotated[
    str | None,
    typer.Option(
        metavar="hf|deepspeed",
        help="What your own command (after --) runs: hf, an HF Trainer script (given the .hf.json), or deepspeed, a"
        " plain DeepSpeed script (given ds_config.json). Default: told from the command (--deepspeed FILE or"
        " TrainingArguments flags: hf; --deepspeed_config: deepspeed).",
    ),
]
HeadroomOpt = Annotated[float, typer.Option(help="Peak must stay under this fraction of free memory.")]
MaxTrialsOpt = Annotated[
    int | None,
    typer.Option(
        help="Most trials to launch (default: derived from the search: two per rung or mode, with and without"
        " checkpointing, and 5 for the pick; 33 for one node's 7 rungs)."
    ),
]
MaxMicroBatchOpt = Annotated[int, typer.Option(help="Largest micro-batch per GPU to consider.")]
MicroBatchesOpt = Annotated[str | None, typer.Option(help="Explicit micro-batch grid, e.g. 1,2,4,8.")]
RungsOpt = Annotated[
    str | None,
    typer.Option(
        help="Restrict the ladder, e.g. z0,z2,z3+offload_opt (rungs: z0, z1, z2, z2+offload_opt, z3,"
        " z3+offload_opt, z3+offload_opt+param, z3+nvme_opt, z3+nvme_opt+param)."
    ),
]
NvmePathOpt = Annotated[str | None, typer.Option("--nvme-path", help="Directory on local NVMe for offload swap files.")]
GpuMemoryFractionOpt = Annotated[float | None, typer.Option(help="Emulate a smaller GPU (fraction of memory).")]
TrialTimeoutOpt = Annotated[float, typer.Option(help="Seconds before a trial is killed as hung.")]
OutOpt = Annotated[str, typer.Option("--out", "-o", help="Where to write ds_config.json.")]
ReportDirOpt = Annotated[str | None, typer.Option(help="Where to write the report (default: beside --out).")]
CacheDirOpt = Annotated[
    str | None,
    typer.Option(
        help="Directory for the results cache (results.sqlite; default $AUTOTUNE_CACHE_DIR, else"
        " $XDG_CACHE_HOME/autotune, else ~/.cache/autotune)."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]
# Output only, not part of the tuning (no TuneRequest field): the same measured figures, shown in more detail.
VerboseOpt = Annotated[
    bool,
    typer.Option(
        "--verbose",
        "-v",
        help="Per trial: the median's 95% interval, step count and single-step spread; after the summary, every"
        " measured candidate's figure.",
    ),
]
OptimizerOpt = Annotated[
    str,
    typer.Option(
        help="adamw (DeepSpeed's AdamW: FusedAdam, or DeepSpeedCPUAdam with optimizer offload), torch-adamw, or"
        " adafactor (memory-saving)."
    ),
]
LoraRankOpt = Annotated[int | None, typer.Option(help="Train LoRA adapters of this rank (peft) on a frozen base.")]
LoraTargetsOpt = Annotated[
    str | None, typer.Option(help="LoRA target modules, e.g. q_proj,v_proj (default: peft's for the model).")
]
MicroBatchOpt = Annotated[
    int | None, typer.Option("--micro-batch", help="Fixed micro-batch per GPU: every rung is evaluated at it.")
]
HostMemoryOpt = Annotated[
    str | None,
    typer.Option(
        "--host-memory",
        help="Host RAM per node of the machine planned for (with --gpu-type/--gpu-memory), e.g. 512GiB;"
        " a bare number is GiB. Default: probed when the GPUs are this machine's (given, it replaces the probe's"
        " figure, and the report says so), else not known.",
    ),
]
DecoderSeqLenOpt = Annotated[
    int | None,
    typer.Option(
        "--decoder-seq-len", help="Encoder-decoder models (T5): the decoder's length; --seq-len is the encoder's."
    ),
]
UserConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--config",
        help='Your ds_config (JSON or hjson, "auto" allowed): answer whether it fits, as DeepSpeed would run it.',
    ),
]
BaseConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--config",
        help='Your ds_config (JSON or hjson, "auto" allowed) to tune on: every key but the batch split and the ZeRO'
        " section is kept as written; its global batch, precision and optimizer are the job's.",
    ),
]
GradCkptOpt = Annotated[
    bool | None,
    typer.Option(
        "--grad-checkpointing/--no-grad-checkpointing",
        help="The model uses gradient checkpointing (for a config's fit; default: as the tuning recorded, else off).",
    ),
]
AllowApproximateOpt = Annotated[
    bool,
    typer.Option(
        "--allow-approximate",
        help="Also try modes that change the training (ZenFlow's selective updates, ZeRO++ int8/int4 quantization,"
        " a partial offload ratio); off by default so the config trains the same model the same way.",
    ),
]
TrialWorkersOpt = Annotated[
    str,
    typer.Option(
        "--trial-workers",
        help="warm: one process runs trial after trial (start-up paid once; replaced after a failure or when memory"
        " a trial left grows); fresh: a new process per trial, as your job starts. auto: warm, and on GPUs the"
        " pick run once more in a fresh process before it is recommended, unless its trial was already the first"
        " of a launch (warm GPU trials are not yet measured against fresh ones).",
    ),
]
TrustRemoteCodeOpt = Annotated[
    bool, typer.Option("--trust-remote-code", help="Allow custom model code from the HF cache.")
]


UserCommandArg = Annotated[
    list[str] | None,
    typer.Argument(
        help=(
            "After `--`: your launch command (own-command mode); each trial runs it with the candidate"
            " substituted in. Placeholders: {ds_config} {micro_batch} {grad_accum} {train_batch} {zero_stage}"
            " {grad_checkpointing} {precision} {bf16} {fp16} {seq_len} {gpus} {nodes} {world_size} {master_port}"
            " {trial_dir}; or keep `--deepspeed <file>` with autotuning.arg_mappings in that file (DeepSpeed"
            " Autotuning's convention)."
        ),
        show_default=False,
    ),
]


def say_assumed_units(**sizes: str | None) -> None:
    """A bare number for a memory size is GiB; say so on stderr, so nobody wonders whether 80 meant bytes."""
    for name, value in sizes.items():
        try:
            number = float(value) if value is not None else None
        except ValueError:
            continue
        if number is not None and math.isfinite(number) and number > 0:
            print(f"autotune: --{name.replace('_', '-')} {value} read as {value} GiB", file=sys.stderr)
