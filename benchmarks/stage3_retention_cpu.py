"""How many parameters ZeRO-3 holds gathered when the loss is computed, measured on the CPU backend.

    DS_ACCELERATOR=cpu python benchmarks/stage3_retention_cpu.py [--out FILE]

Two ranks (gloo), real DeepSpeed ZeRO-3, small models built under deepspeed.zero.Init: Llama with a large
vocabulary (its output layer larger than the blocks together) tied and untied and with a small one, with and
without gradient checkpointing; GPT-2 (one fused qkv matrix) and T5 (encoder-decoder, cross-attention); at reuse
distances chosen around the trace's break points. After the third step's forward (DeepSpeed replays its
recorded trace from the second step), every parameter whose ds_status is AVAILABLE is gathered: their elements
are DeepSpeed's own answer. The memory model's answer is autotune.estimate.stage3_retention.gathered_at_turn
on the summary autotune makes of the same config. The prefetch bucket and the persistence threshold are 0 so
that only the release rule decides; one case keeps DeepSpeed's default prefetch to show what prefetching adds.
Results: results/stage3_retention_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "stage3_retention_cpu.json"
MAX_LIVE = 1_000_000_000
LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 64,
}
GPT2 = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "n_embd": 64,
    "n_head": 4,
    "n_positions": 64,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
T5 = {
    "model_type": "t5",
    "architectures": ["T5ForConditionalGeneration"],
    "d_model": 64,
    "d_kv": 16,
    "d_ff": 128,
    "num_heads": 4,
    "feed_forward_proj": "gated-gelu",
    "tie_word_embeddings": False,
    "decoder_start_token_id": 0,
    "pad_token_id": 0,
    "eos_token_id": 1,
}


def _llama(vocab: int, blocks: int, tied: bool) -> dict:
    return {**LLAMA, "vocab_size": vocab, "num_hidden_layers": blocks, "tie_word_embeddings": tied}


# name, config, checkpointing, reuse distance, prefetch bucket (0: release rule only)
CASES = [
    ("llama large-vocab untied, default distance", _llama(8192, 6, False), False, 1_000_000_000, 0),
    ("llama large-vocab untied, distance under twice the output layer", _llama(8192, 6, False), False, 1_000_000, 0),
    ("llama large-vocab untied, distance a little over it", _llama(8192, 6, False), False, 1_200_000, 0),
    ("llama large-vocab untied, checkpointing", _llama(8192, 6, False), True, 1_200_000, 0),
    ("llama large-vocab tied", _llama(8192, 6, True), False, 700_000, 0),
    ("llama large-vocab tied, checkpointing", _llama(8192, 6, True), True, 700_000, 0),
    ("llama small-vocab, 3 blocks' distance", _llama(256, 8, False), False, 130_000, 0),
    ("llama small-vocab, 3 blocks' distance, checkpointing", _llama(256, 8, False), True, 130_000, 0),
    ("llama small-vocab, no reuse", _llama(256, 8, False), False, 0, 0),
    ("llama small-vocab, 3 blocks' distance, default prefetch", _llama(256, 8, False), False, 130_000, 50_000_000),
    ("gpt2 tied, 3 blocks' distance", {**GPT2, "vocab_size": 512, "n_layer": 8}, False, 150_000, 0),
    ("gpt2 tied, 3 blocks' distance, checkpointing", {**GPT2, "vocab_size": 512, "n_layer": 8}, True, 150_000, 0),
    (
        "t5 untied, 2 blocks' distance",
        {**T5, "vocab_size": 512, "num_layers": 4, "num_decoder_layers": 4},
        False,
        120_000,
        0,
    ),
    (
        "t5 untied, default distance",
        {**T5, "vocab_size": 512, "num_layers": 4, "num_decoder_layers": 4},
        False,
        1_000_000_000,
        0,
    ),
]


def worker(cases_file: Path, out_file: Path) -> None:
    """One rank: run every case, write DeepSpeed's gathered count at the turn (rank 0)."""
    import deepspeed
    import torch
    import transformers
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    deepspeed.init_distributed(dist_backend="gloo")
    classes = {
        name: getattr(transformers, name)
        for name in ("LlamaForCausalLM", "GPT2LMHeadModel", "T5ForConditionalGeneration")
    }  # before zero.Init
    rows = []
    for name, config, checkpointing, reuse, prefetch in json.loads(cases_file.read_text()):
        ds_config = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {
                "stage": 3,
                "stage3_max_reuse_distance": reuse,
                "stage3_max_live_parameters": MAX_LIVE,
                "stage3_prefetch_bucket_size": prefetch,
                "stage3_param_persistence_threshold": 0,
            },
        }
        torch.manual_seed(0)
        model_config = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
        with deepspeed.zero.Init(config_dict_or_path=ds_config):
            model = classes[config["architectures"][0]](model_config)
        if checkpointing:
            model.gradient_checkpointing_enable()
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        ids = torch.randint(0, config["vocab_size"], (1, 16))
        gathered = 0
        for _ in range(3):
            loss = engine(input_ids=ids, labels=ids).loss
            unique = {id(p): p for p in model.parameters()}.values()
            gathered = sum(p.ds_numel for p in unique if p.ds_status == ZeroParamStatus.AVAILABLE)
            engine.backward(loss)
            engine.step()
        rows.append({"case": name, "deepspeed_gathered_elements": gathered})
        engine.destroy()
    if torch.distributed.get_rank() == 0:
        out_file.write_text(
            json.dumps(
                {
                    "rows": rows,
                    "deepspeed": deepspeed.__version__,
                    "torch": torch.__version__,
                    "transformers": transformers.__version__,
                }
            )
        )


def _predict(config: dict, checkpointing: bool, reuse: int, prefetch: int) -> dict:
    from autotune.estimate.stage3_retention import gathered_at_turn
    from autotune.models.model_summary import summarize
    from autotune.models.resolve import resolve_model

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config))
        model = summarize(resolve_model(folder), use_cache=False)
    retained, prefetched = gathered_at_turn(model, reuse, checkpointing, prefetch, max_live=MAX_LIVE)
    return {
        "total_params": model.total_params,
        "predicted_retained": retained,
        "predicted_prefetched": prefetched,
        "predicted_elements": retained + prefetched,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--only", default="", help="run only the cases whose name contains this text")
    parser.add_argument("--worker", nargs=2, type=Path, metavar=("CASES", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    with tempfile.TemporaryDirectory() as folder:
        cases, measured = Path(folder) / "cases.json", Path(folder) / "measured.json"
        chosen = [case for case in CASES if args.only in case[0]]
        cases.write_text(json.dumps(chosen))
        env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--standalone",
            __file__,
            "--worker",
            str(cases),
            str(measured),
        ]
        subprocess.run(command, env=env, check=True)
        result = json.loads(measured.read_text())
    sys.path.insert(0, str(HERE.parent / "src"))  # the model's side runs from this checkout
    for row, (_, config, checkpointing, reuse, prefetch) in zip(result["rows"], chosen, strict=True):
        row.update(
            config=config,
            checkpointing=checkpointing,
            reuse_distance=reuse,
            prefetch_bucket=prefetch,
            **_predict(config, checkpointing, reuse, prefetch),
        )
        measured = row["deepspeed_gathered_elements"]
        row["error"] = (row["predicted_elements"] - measured) / measured if measured else 0.0
        print(
            f"{row['case']:<62} deepspeed {measured:>9,}  model {row['predicted_elements']:>9,} "
            f"({row['error']:+.1%})  of {row['total_params']:,}"
        )
    result.update(
        python=platform.python_version(),
        machine=platform.machine(),
        date=datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        ranks=2,
    )
    from autotune.infra.atomic import atomic_write_json

    atomic_write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
