"""A user's plain DeepSpeed training script (random tokens, CPU-capable with DS_ACCELERATOR=cpu).

It knows nothing about autotune: it reads its DeepSpeed config from --deepspeed_config, builds a causal LM
from a config.json, and loops forward/backward/step. `--fault` makes it misbehave for the classification
tests: `raise` (an error at the first step), `hang` (sleeps forever), `early` (exits 0 after one optimizer
step, before any profiling step), `grow` (holds micro_batch x --grow-mib MiB of host memory from the first
step on, so a host budget is crossed above some micro-batch).
"""

from __future__ import annotations

import argparse
import json
import time

import deepspeed
import torch
from transformers import AutoConfig, AutoModelForCausalLM


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deepspeed_config", required=True)
    parser.add_argument("--model-config", required=True, help="a config.json file or the directory holding it")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
    parser.add_argument("--gradient-checkpointing", default="false")
    parser.add_argument("--fault", choices=["none", "raise", "hang", "early", "grow"], default="none")
    parser.add_argument("--grow-mib", type=int, default=64)
    parser.add_argument("--local_rank", type=int, default=-1)  # the deepspeed launcher passes it
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    with open(args.deepspeed_config) as handle:
        ds_config = json.load(handle)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model_config))
    if args.gradient_checkpointing == "true":
        model.gradient_checkpointing_enable()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    micro_batch = engine.train_micro_batch_size_per_gpu()
    vocab = model.config.vocab_size
    ballast = []
    last = time.perf_counter()
    for step in range(args.steps):
        if args.fault == "early" and step == 1:
            print("finished early", flush=True)
            return
        for _ in range(engine.gradient_accumulation_steps()):
            if args.fault == "raise":
                raise ValueError("user code failed: bad batch shape")
            if args.fault == "hang":
                time.sleep(3600)
            if args.fault == "grow" and not ballast:
                ballast.append(torch.ones(micro_batch * args.grow_mib * 2**20, dtype=torch.uint8))
            ids = torch.randint(0, vocab, (micro_batch, args.seq_len), device=engine.device)
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
        now = time.perf_counter()  # the script's own clock: one whole optimizer step, data included
        if engine.global_rank == 0:
            print(f"step {step + 1} loss {loss.item():.4f} wall_s {now - last:.6f}", flush=True)
        last = now
    print(json.dumps({"steps": args.steps, "micro_batch": micro_batch}), flush=True)
    # Without it, gloo's worker threads can outlive the interpreter and abort the exit with "terminate called
    # without an active exception" (SIGABRT) after a finished run: pytorch/pytorch#190489; torch's docs ask
    # every script to end this way.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
