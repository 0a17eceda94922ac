"""The `-- <command>` argument shared by `autotune tune` and `autotune hook` (own-command mode)."""

from __future__ import annotations

from typing import Annotated

import typer

UserCommandArg = Annotated[
    list[str] | None,
    typer.Argument(
        help=(
            "After `--`: your launch command; each trial runs it with the candidate substituted in. Placeholders:"
            " {ds_config} {micro_batch} {grad_accum} {train_batch} {zero_stage} {grad_checkpointing} {precision}"
            " {bf16} {fp16} {seq_len} {gpus} {nodes} {world_size} {master_port} {trial_dir}; or keep"
            " `--deepspeed <file>` with autotuning.arg_mappings in that file (DeepSpeed Autotuning's convention)."
        ),
        show_default=False,
    ),
]
