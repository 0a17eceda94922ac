"""The smallest training script the examples launch: a model from autotune's profiles, synthetic tokens,
a few DeepSpeed steps with the given config. Replace it with your own; it takes `--deepspeed CONFIG`
as HF Trainer scripts do, so the launch lines in examples/slurm and examples/torchrun stay the same.

    torchrun --nproc-per-node 2 examples/train.py --deepspeed ds_config.json --model tiny-gpt2 --steps 3
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepspeed", required=True, help="ds_config.json (e.g. written by `autotune hook`)")
    parser.add_argument("--model", default="tiny-gpt2", help="an autotune model name, hub id or config.json")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps")
    parser.add_argument("--gradient_checkpointing", action="store_true")
    args = parser.parse_args()

    import deepspeed
    import torch

    from autotune.models import resolve_model
    from autotune.models.build import build_model

    source = resolve_model(args.model)
    model, _ = build_model(source.config, source.architecture, device="cpu")
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=args.deepspeed)
    micro_batch = engine.train_micro_batch_size_per_gpu()
    vocab = model.config.vocab_size
    loss = None
    for _ in range(args.steps * engine.gradient_accumulation_steps()):
        tokens = torch.randint(0, vocab, (micro_batch, args.seq_len), device=engine.device)
        loss = engine(input_ids=tokens, labels=tokens).loss
        engine.backward(loss)
        engine.step()
    if engine.global_rank == 0 and loss is not None:
        print(
            f"trained {args.steps} step(s) at world size {engine.world_size}, micro-batch {micro_batch}:"
            f" loss {loss.item():.3f}",
            flush=True,
        )
    # Without it, gloo's worker threads can outlive the interpreter and abort the exit with "terminate called
    # without an active exception" (SIGABRT) after a finished run: pytorch/pytorch#190489; torch's docs ask
    # every script to end this way.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
