"""Training script that DeepSpeed's own autotuner launches (`deepspeed --autotuning tune ... this.py`).

It builds the same model the autotune trial worker builds (autotune.models.resolve_model + build_model) and
trains it on random token batches at the same sequence length, so both tuners measure the same workload.

The autotuner drives everything through the config: with "autotuning" enabled, DeepSpeed's engine exits on
its own after `end_profile_step` optimizer steps (writing metrics.json), and the model-info profile run
exits inside the first forward. The loop below therefore only has to keep stepping; its step cap is a guard
for runs without autotuning.

Stay quiet on stderr: the autotuner marks an experiment failed when the word "error" appears there.
"""

from __future__ import annotations

import argparse
import os
import warnings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse_args() -> argparse.Namespace:
    import deepspeed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="autotune --model spec, e.g. gpt2-small-demo")
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--gpu-memory-fraction", type=float, default=None, help="emulate a smaller card")
    parser.add_argument("--max-steps", type=int, default=50, help="optimizer steps if autotuning never exits")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", "0")))
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def synthetic_batch(vocab_size: int, micro_batch: int, seq_len: int, device: object, seed: int) -> dict:
    """Random tokens as input and labels, one batch reused every step: the autotune trial worker's workload.

    Labels = inputs works for causal LMs (they shift), T5 (decoder inputs derive from labels) and MLM heads.
    """
    import torch

    generator = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, vocab_size, (micro_batch, seq_len), generator=generator).to(device)
    return {"input_ids": ids, "labels": ids.clone()}


def main() -> None:
    warnings.filterwarnings("ignore")  # a warning mentioning "error" would fail the experiment
    args = parse_args()
    import deepspeed
    import torch

    from autotune.models import resolve_model
    from autotune.models.architecture import build_model

    if args.device == "cuda":
        torch.cuda.set_device(args.local_rank)
        if args.gpu_memory_fraction:
            torch.cuda.set_per_process_memory_fraction(args.gpu_memory_fraction, args.local_rank)
    torch.manual_seed(args.seed)
    source = resolve_model(args.model)
    model, _ = build_model(source.config, source.architecture, device="cpu")
    model.train()
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    micro_batch = engine.train_micro_batch_size_per_gpu()
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    vocab_size = int(text_config.vocab_size)
    batch = synthetic_batch(vocab_size, micro_batch, args.seq_len, engine.device, device=args.seed + engine.global_rank)
    micro_steps = args.max_steps * engine.gradient_accumulation_steps()
    for _ in range(micro_steps):
        loss = engine(**batch).loss
        engine.backward(loss)
        engine.step()


if __name__ == "__main__":
    main()
