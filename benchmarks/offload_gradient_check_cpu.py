"""What DeepSpeed's stage-2 optimizer-offload path allocates for one large gradient, measured on the CPU backend.

    DS_ACCELERATOR=cpu python benchmarks/offload_gradient_check_cpu.py [--out FILE]
    python benchmarks/offload_gradient_check_cpu.py --tied --tokens 512 --out FILE  # tied embedding, more activations
    PYTHONPATH=/path/to/other/deepspeed python benchmarks/offload_gradient_check_cpu.py --out FILE  # another version

One rank, ZeRO-2 with offload_optimizer cpu, bf16, overlap_comm (two reduce buffers), a model whose output layer
and embedding are 2^16 x 64 = 4,194,304 elements each (untied), 16 tokens so activations are negligible. The
backward runs under torch.profiler with profile_memory and its memory timeline gives the peak of everything
allocated during backward over what was allocated when it started. Less the two reduce buffers, what remains
per element of the largest gradient is the largest temporary the offload path makes of one gradient
(set_norm_for_param_grad_in_gpu, the overflow check, the fp32 copy), which the memory model sizes with
autotune.estimate.buffers.offload_gradient_check_bytes. With --tied the output layer shares the embedding's
weight: its gradient is complete only after the embedding's backward, so the temporaries come after the
activations' gradients are freed and the peak is the larger of the two moments, not their sum
(buffers.largest_gradient_made_last). Results: results/offload_gradient_check_cpu*.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "offload_gradient_check_cpu.json"
VOCAB, HIDDEN = 1 << 16, 64
BUCKET_ELEMENTS = 500_000_000  # DeepSpeed's default reduce_bucket_size, two buffers with overlap_comm


def _single_rank_environment() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def measure(tied: bool = False, tokens: int = 16) -> dict:
    _single_rank_environment()
    import deepspeed
    import torch
    from torch.profiler import ProfilerActivity, profile

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(VOCAB, HIDDEN)
            self.middle = torch.nn.Linear(HIDDEN, HIDDEN)
            self.head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)

        def forward(self, ids):
            logits = self.head(torch.relu(self.middle(self.embedding(ids))))
            return torch.nn.functional.cross_entropy(logits.float().view(-1, VOCAB), ids.view(-1))

    torch.manual_seed(0)
    model = Net()
    if tied:
        model.head.weight = model.embedding.weight
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,  # torch AdamW on the host, as HF Trainer hands it over
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "overlap_comm": True},
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    ids = torch.randint(0, VOCAB, (1, tokens))
    elements = VOCAB * HIDDEN
    peaks = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(2):  # the second step runs with every lazy structure in place
            loss = engine(ids)
            activities = [ProfilerActivity.CPU]
            with profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as prof:
                engine.backward(loss)
            engine.step()
            timeline = Path(folder) / "timeline.json"
            prof.export_memory_timeline(str(timeline), device="cpu")
            totals = [sum(row) for row in json.loads(timeline.read_text())[1]]
            peaks.append(max(totals) - totals[0])
    buckets = 2 * BUCKET_ELEMENTS * 2
    return {
        "deepspeed": deepspeed.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "tied": tied,
        "tokens": tokens,
        "largest_gradient_elements": elements,
        "reduce_buffer_bytes": buckets,
        "backward_peak_over_start_bytes": peaks,
        "transient_bytes_per_element": [(peak - buckets) / elements for peak in peaks],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--tied", action="store_true", help="the output layer shares the embedding's weight")
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args(argv)
    result = measure(args.tied, args.tokens)
    sys.path.insert(0, str(HERE.parent / "src"))
    from autotune.estimate.buffers import offload_gradient_check_bytes
    from autotune.estimate.runtime import RuntimeStack

    central, _ = offload_gradient_check_bytes(1, RuntimeStack(deepspeed_version=result["deepspeed"]))
    result["model_bytes_per_element"] = central
    from autotune.infra.atomic import atomic_write_json

    atomic_write_json(args.out, result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
