"""A plain DeepSpeed training script (random data), for the config autotune wrote:

    deepspeed --num_gpus N examples/training/train_deepspeed.py --deepspeed --deepspeed_config ds_config.json
    torchrun --nproc-per-node N examples/training/train_deepspeed.py --deepspeed --deepspeed_config ds_config.json

`--deepspeed` is a flag and `--deepspeed_config` the file, as `deepspeed.add_config_arguments` defines them.
Micro-batch, accumulation and precision come from the config alone. On a machine without a GPU, set
DS_ACCELERATOR=cpu.
"""

from __future__ import annotations

import argparse

import deepspeed
import torch
from common import RandomTokens, engine_facts, finish, load_model, maybe_lora, report


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-gpt2", help="autotune profile, HF model dir or config.json")
    parser.add_argument("--seq_len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps")
    parser.add_argument("--gradient_checkpointing", action="store_true")
    parser.add_argument("--optimizer", default=None, help="client optimizer when the config names none: adafactor")
    parser.add_argument("--lora_rank", type=int, default=None)
    parser.add_argument("--lr", type=float, default=1e-4, help="for a client optimizer only")
    parser.add_argument("--report_json", default=None)
    parser.add_argument("--local_rank", type=int, default=-1)  # the deepspeed launcher passes it
    return deepspeed.add_config_arguments(parser).parse_args()


def main() -> None:
    args = parse()
    deepspeed.init_distributed()
    model = maybe_lora(load_model(args.model), args.lora_rank)
    if args.gradient_checkpointing:
        model.config.use_cache = False
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = None
    if args.optimizer:
        from autotune.training.optimizers import build_client_optimizer

        optimizer = build_client_optimizer(args.optimizer, trainable, args.lr)
    engine, *_ = deepspeed.initialize(args=args, model=model, model_parameters=trainable, optimizer=optimizer)
    micro, accumulation = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    data = RandomTokens(model.config.vocab_size, args.seq_len, micro * accumulation * args.steps)
    loader = torch.utils.data.DataLoader(data, batch_size=micro)
    for batch in loader:
        loss = engine(**{k: v.to(engine.device) for k, v in batch.items()}).loss
        engine.backward(loss)
        engine.step()
    report(engine_facts(engine, model), args.report_json)
    finish()


if __name__ == "__main__":
    main()
