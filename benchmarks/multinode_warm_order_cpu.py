"""Does an earlier trial change a later one's speed in warm workers? ZeRO-0, ZeRO-0, ZeRO-2, ZeRO-0 (CPU backend).

    python benchmarks/multinode_warm_order_cpu.py [--out results/multinode_warm_order_cpu.json]

Tiny GPT-2 at micro-batch 4, the four trials in one warm pool as the tuner runs them (its environment and specs):
across two "nodes" (a torchrun per node, one rank each: trial/launch/warm_nodes.py LocalNodesStart) and on one node
with two ranks (one torchrun). In multinode_warm_cpu_2026-11-29.md the warm search ranked ZeRO-0 first where fresh
launches rank it last; this isolates the order.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

from autotune.core.ladder import Candidate, Rung
from autotune.infra.atomic import atomic_write_json
from autotune.request.context import TuneContext
from autotune.request.tune_request import TuneRequest
from autotune.trial.launch.chooser import CPU_TRIAL_ENV
from autotune.trial.launch.ops import prebuild_ops
from autotune.trial.launch.warm import WarmWorkerPool
from autotune.trial.launch.warm_nodes import LocalNodesStart

RESULTS = Path(__file__).resolve().parent / "results" / "multinode_warm_order_cpu.json"
ORDER = (Rung.Z0, Rung.Z0, Rung.Z2, Rung.Z0)


def one_order(nodes: int) -> list[dict]:
    request = TuneRequest.of(
        model="tiny-gpt2", device="cpu", gpus=2 // nodes, nodes=nodes, memory_budget="2GiB", seq_len=32,
        out="unused.json", use_cache=False,
    )  # fmt: skip
    ctx = TuneContext.build(request, outputs=False)
    start = {"start": LocalNodesStart()} if nodes > 1 else {}
    rows = []
    with WarmWorkerPool(env=CPU_TRIAL_ENV, **start) as pool:  # type: ignore[arg-type]
        for rung in ORDER:
            result = pool.run(ctx.spec(Candidate(rung, micro_batch=4)))
            rows.append(
                {
                    "rung": rung.value,
                    "status": result.status,
                    "samples_per_s": round(result.samples_per_s or 0.0, 1),
                    "step_times_s": [round(t, 4) for t in result.step_times_s],
                    "load_1min": round(os.getloadavg()[0], 2),
                }
            )
        assert pool.restarts == 1, "the workers were replaced: the order is no longer one process's"
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    prebuild_ops("cpu")
    import deepspeed
    import torch

    orders = {f"{nodes} node(s)": one_order(nodes) for nodes in (2, 1)}
    atomic_write_json(
        args.out,
        {
            "benchmark": "ZeRO-0, ZeRO-0, ZeRO-2, ZeRO-0 in one warm pool: across two nodes and on one (CPU)",
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "deepspeed": deepspeed.__version__,
            "orders": orders,
        },
    )


if __name__ == "__main__":
    main()
