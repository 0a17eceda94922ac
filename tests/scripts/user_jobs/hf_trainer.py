"""A user's HF Trainer script (random tokens, CPU-capable with DS_ACCELERATOR=cpu).

Standard TrainingArguments flags (`--deepspeed`, `--per_device_train_batch_size`,
`--gradient_accumulation_steps`, `--gradient_checkpointing`, `--bf16`, `--max_steps`, ...) parsed with
HfArgumentParser, as in transformers' example scripts, so DeepSpeed autotuning's `arg_mappings` apply as is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch
from transformers import AutoConfig, AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class ScriptArguments:
    model_config: str = field(metadata={"help": "a config.json file or the directory holding it"})
    seq_len: int = 64
    samples: int = 4096


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, vocab: int, seq_len: int, count: int) -> None:
        self.ids = torch.randint(0, vocab, (count, seq_len), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def main() -> None:
    script_args, training_args = HfArgumentParser((ScriptArguments, TrainingArguments)).parse_args_into_dataclasses()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(script_args.model_config))
    data = RandomTokens(model.config.vocab_size, script_args.seq_len, script_args.samples)
    trainer = Trainer(model=model, args=training_args, train_dataset=data)
    output = trainer.train()
    if training_args.process_index == 0:
        print(json.dumps({"global_step": output.global_step, "loss": output.training_loss}), flush=True)
    # Without it, gloo's worker threads can outlive the interpreter and abort the exit with "terminate called
    # without an active exception" (SIGABRT) after a finished run: pytorch/pytorch#190489; torch's docs ask
    # every script to end this way.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
