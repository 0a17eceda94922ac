"""What eager attention keeps per s^2 score element under the installed transformers, family by family.

Runs with any transformers from 4.28 on and does not import autotune, so it can run in a throwaway virtualenv
per transformers version (how benchmarks/results/eager_attention_versions.json was made; see benchmarks/README.md,
"Eager attention across transformers versions"). Per family (tiny OPT, GPT-NeoX, GPT-2, BERT, BLOOM, T5 encoder
with eager attention) and precision it records the bytes of the distinct tensors autograd saves whose last two
dimensions are (s, s), per score element, by dtype (saved-tensor hooks: exact). For OPT it also records the
MemTracker activation peak of one forward/backward of tests/data/models/tiny-opt.json, and the kept and
backward-transient bytes of OPT's attention op sequence as 4.28.1 and 5.23 write it (copied below, so those two
rows do not depend on the installed version).

    python benchmarks/eager_attention_versions.py --out benchmarks/results/eager_attention_versions.json

appends (or replaces) the installed version's run in --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

import torch
import transformers
from torch.distributed._tools.mem_tracker import MemTracker

LAYERS, HEADS, HIDDEN, SEQ, BATCH = 2, 4, 64, 256, 2
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TINY_OPT = Path(__file__).resolve().parents[1] / "tests" / "data" / "models" / "tiny-opt.json"
OPT_PEAK_CASES = (("fp32", 1, 512), ("fp16", 1, 512), ("bf16", 1, 512), ("fp16", 2, 256), ("bf16", 2, 256))


def _families() -> dict:
    t = transformers
    # GPT-NeoX and BERT configs take the same names
    encoder_style = dict(
        vocab_size=500,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=256,
        max_position_embeddings=SEQ,
    )
    return {
        "opt": (
            t.OPTModel,
            t.OPTConfig(
                vocab_size=500,
                hidden_size=HIDDEN,
                num_hidden_layers=LAYERS,
                ffn_dim=256,
                num_attention_heads=HEADS,
                max_position_embeddings=SEQ + 2,
                word_embed_proj_dim=HIDDEN,
                dropout=0.0,
            ),
        ),
        "gpt_neox": (
            t.GPTNeoXModel,
            t.GPTNeoXConfig(**encoder_style),
        ),
        "gpt2": (
            t.GPT2Model,
            t.GPT2Config(
                vocab_size=500,
                n_embd=HIDDEN,
                n_layer=LAYERS,
                n_head=HEADS,
                n_positions=SEQ,
                bos_token_id=0,
                eos_token_id=0,
            ),
        ),
        "bert": (
            t.BertModel,
            t.BertConfig(**encoder_style),
        ),
        "bloom": (t.BloomModel, t.BloomConfig(vocab_size=500, hidden_size=HIDDEN, n_layer=LAYERS, n_head=HEADS)),
        "t5": (
            t.T5EncoderModel,
            t.T5Config(
                vocab_size=500, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=256, num_layers=LAYERS, num_heads=HEADS
            ),
        ),
    }


def _eager(config):
    config._attn_implementation = "eager"  # ignored by releases without the attribute (eager was all they had)
    return config


def saved_per_score(model_class, config, dtype) -> dict[str, float]:
    torch.manual_seed(0)
    model = model_class(_eager(config)).to(dtype).train()
    storages: dict[int, tuple[str, int]] = {}

    def pack(tensor):
        if tensor.dim() >= 2 and tensor.shape[-2:] == (SEQ, SEQ) and tensor.numel() >= BATCH * HEADS * SEQ * SEQ:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = (str(tensor.dtype).replace("torch.", ""), storage.nbytes())
        return tensor

    ids = torch.randint(0, 500, (BATCH, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(input_ids=ids)
    scores = LAYERS * BATCH * HEADS * SEQ * SEQ
    by_dtype: dict[str, float] = {}
    for dtype_name, nbytes in storages.values():
        by_dtype[dtype_name] = by_dtype.get(dtype_name, 0.0) + nbytes / scores
    return {"total": sum(by_dtype.values()), **by_dtype}


def _live(tracker, kind: str) -> int:
    snapshots = tracker.get_tracker_snapshot(kind)
    if not snapshots:
        return 0
    return sum(v for key, v in next(iter(snapshots.values())).items() if "Total" in str(key))


def opt_activation_peak(precision: str, micro_batch: int, seq_len: int) -> int:
    """All live tensors minus parameters and their gradients at the step's peak (as tests/ measure it)."""
    spec = json.loads(TINY_OPT.read_text())
    config = _eager(transformers.OPTConfig(**{k: v for k, v in spec["config"].items() if k != "model_type"}))
    torch.manual_seed(0)
    model = transformers.OPTForCausalLM(config).to(DTYPES[precision]).train()
    ids = torch.randint(0, 1000, (micro_batch, seq_len))
    model(input_ids=ids, labels=ids).loss.backward()  # warm-up
    model.zero_grad(set_to_none=True)
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        model(input_ids=ids, labels=ids).loss.backward()
    peak = {str(k).split(".")[-1]: v for k, v in next(iter(tracker.get_tracker_snapshot("peak").values())).items()}
    return peak["Total"] - peak.get("PARAM", 0) - peak.get("GRAD", 0)


def _opt_428(q, k, v, mask):
    """transformers 4.28.1 models/opt/modeling_opt.py:211-255 (OPTAttention.forward), b*h folded."""
    b, h, s, d = q.shape
    weights = torch.bmm(q.reshape(b * h, s, d), k.reshape(b * h, s, d).transpose(1, 2))
    weights = weights.view(b, h, s, s) + mask
    weights = torch.max(weights, torch.tensor(torch.finfo(weights.dtype).min))
    weights = weights.view(b * h, s, s)
    if weights.dtype == torch.float16:
        weights = torch.nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(torch.float16)
    else:
        weights = torch.nn.functional.softmax(weights, dim=-1)
    weights = torch.nn.functional.dropout(weights, p=0.0, training=True)
    return torch.bmm(weights, v.reshape(b * h, s, d))


def _opt_523(q, k, v, mask):
    """transformers 5.23 models/opt/modeling_opt.py:84-91 (eager_attention_forward)."""
    weights = torch.matmul(q, k.transpose(-1, -2)) * 1.0
    weights = weights + mask
    weights = torch.nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
    weights = torch.nn.functional.dropout(weights, p=0.0, training=True)
    return torch.matmul(weights, v)


def op_sequence(function, dtype, batch: int = 1, heads: int = 4, seq_len: int = 512, head_dim: int = 16) -> dict:
    """Kept bytes per score after the forward (minus output and its gradient) and the backward's peak above it."""
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, dtype=dtype, requires_grad=True) for _ in range(3))
    causal = torch.triu(torch.full((seq_len, seq_len), torch.finfo(dtype).min, dtype=dtype), 1)
    mask = causal[None, None].expand(batch, 1, seq_len, seq_len).contiguous()
    function(q, k, v, mask).sum().backward()  # warm-up
    tracker = MemTracker()
    with tracker:
        output = function(q, k, v, mask)
        grad = torch.ones_like(output)
        after_forward = _live(tracker, "current")
        output.backward(grad)
        peak = _live(tracker, "peak")
    scores = batch * heads * seq_len * seq_len
    kept = after_forward - 2 * output.numel() * output.element_size()
    return {
        "kept_per_score": round(kept / scores, 3),
        "backward_peak_above_kept_per_score": round((peak - after_forward) / scores, 3),
    }


def run() -> dict:
    families = {}
    for name, (model_class, config) in _families().items():
        for precision, dtype in DTYPES.items():
            families[f"{name}/{precision}"] = {
                k: round(v, 3) for k, v in saved_per_score(model_class, config, dtype).items()
            }
    peaks = {f"{p},{mb},{s}": opt_activation_peak(p, mb, s) for p, mb, s in OPT_PEAK_CASES}
    ops = {
        f"{name}/{p}": op_sequence(fn, DTYPES[p])
        for name, fn in (("4.28.1", _opt_428), ("5.23", _opt_523))
        for p in DTYPES
    }
    return {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "date": datetime.date.today().isoformat(),
        "saved_score_bytes_per_element": families,
        "tiny_opt_activation_peak_bytes": peaks,
        "opt_attention_op_sequences": ops,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results JSON; this version's run is replaced")
    args = parser.parse_args()
    try:
        existing = json.loads(args.out.read_text()) if args.out.exists() else {"runs": []}
    except (OSError, ValueError) as error:
        print(f"error: cannot read {args.out}: {error}", file=sys.stderr)
        return 2
    result = run()
    runs = [r for r in existing.get("runs", []) if r.get("transformers") != result["transformers"]] + [result]
    existing["runs"] = sorted(runs, key=lambda r: [int(x) for x in r["transformers"].split(".")[:3]])
    temporary = args.out.with_suffix(".tmp")
    temporary.write_text(json.dumps(existing, indent=1) + "\n")
    temporary.replace(args.out)
    print(json.dumps({k: v for k, v in result.items() if k != "opt_attention_op_sequences"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
