"""Train a tiny model for a few steps with transformers.Trainer under a given DeepSpeed config (CPU backend)."""

import json
import sys

import torch
from transformers import Trainer, TrainingArguments

from autotune.models import resolve_model
from autotune.models.build import build_model


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, vocab: int, seq_len: int, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (count, seq_len), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def main(config_path: str, out_dir: str, model_name: str, steps: int, micro_batch: int, ckpt: bool) -> None:
    source = resolve_model(model_name)
    model, _ = build_model(source.config, source.architecture, device="cpu")
    args = TrainingArguments(
        output_dir=out_dir, max_steps=steps, per_device_train_batch_size=micro_batch, deepspeed=config_path,
        bf16=True, use_cpu=True, report_to=[], logging_steps=1, save_strategy="no", learning_rate=1e-4,
        gradient_checkpointing=ckpt, dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(model.config.vocab_size, 32, 64))
    output = trainer.train()
    print(json.dumps({"global_step": output.global_step, "loss": output.training_loss}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1")
