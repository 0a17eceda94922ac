"""An HF Trainer script (random data), for autotune's .hf.json and the TrainingArguments flags it prints:

    deepspeed --num_gpus N examples/training/train_hf.py --deepspeed ds_config.hf.json \
        --per_device_train_batch_size 8 --gradient_accumulation_steps 4 --bf16
    accelerate launch --config_file ds_config.accelerate.yaml examples/training/train_hf.py <the same flags>

Every TrainingArguments flag is accepted (`HfArgumentParser`); `--model`, `--seq_len`, `--lora_rank` and
`--report_json` are this script's. On a machine without a GPU, set DS_ACCELERATOR=cpu.
"""

from __future__ import annotations

from dataclasses import dataclass

from common import RandomTokens, engine_facts, finish, load_model, maybe_lora, report
from transformers import HfArgumentParser, Trainer, TrainingArguments


@dataclass
class ScriptArguments:
    model: str = "tiny-gpt2"
    seq_len: int = 64
    lora_rank: int | None = None
    report_json: str | None = None


def main() -> None:
    script, args = HfArgumentParser((ScriptArguments, TrainingArguments)).parse_args_into_dataclasses()
    model = maybe_lora(load_model(script.model), script.lora_rank)
    steps = args.max_steps if args.max_steps > 0 else 3
    samples = steps * args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
    trainer = Trainer(
        model=model, args=args, train_dataset=RandomTokens(model.config.vocab_size, script.seq_len, samples)
    )
    trainer.train()
    report(engine_facts(trainer.model_wrapped, trainer.model), script.report_json)
    finish()


if __name__ == "__main__":
    main()
