"""Options shared by several commands, declared once."""

from __future__ import annotations

from typing import Annotated

import typer

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="Built-in profile, local HF dir / config.json, or cached hub id.")
]
GpusOpt = Annotated[int | None, typer.Option("--gpus", "-g", help="GPUs per node (default: all visible).")]
NodesOpt = Annotated[int, typer.Option("--nodes", "-n", help="Number of nodes.")]
GpuTypeOpt = Annotated[
    str | None, typer.Option("--gpu-type", help="Plan for this accelerator profile, e.g. a100-80gb.")
]
GpuMemoryOpt = Annotated[
    str | None, typer.Option("--gpu-memory", help="Plan for a GPU with this much memory, e.g. 80GiB.")
]
SeqLenOpt = Annotated[int, typer.Option("--seq-len", "-s", help="Training sequence length in tokens.")]
GlobalBatchOpt = Annotated[int | None, typer.Option("--global-batch", help="Effective batch to keep fixed (samples).")]
PrecisionOpt = Annotated[str | None, typer.Option("--precision", help="bf16 or fp16 (default: bf16 where supported).")]
NvmePathOpt = Annotated[str | None, typer.Option("--nvme-path", help="Directory on local NVMe for offload swap files.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]
TrustRemoteCodeOpt = Annotated[
    bool, typer.Option("--trust-remote-code", help="Allow custom model code from the HF cache.")
]
