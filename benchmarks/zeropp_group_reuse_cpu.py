"""Two ZeRO-3 hpZ engines in one process, as a warm worker builds them, with and without the release (CPU backend).

    python benchmarks/zeropp_group_reuse_cpu.py [--out results/zeropp_group_reuse_cpu.json]

Four ranks on this machine (torchrun, gloo). Each rank builds a ZeRO-3 engine with `zero_hpz_partition_size` 2, one
step, destroys it, then a second engine with hpZ 4, the way two trials of one warm worker run; the model is built
outside zero.Init (the runtime/zero/stage3.py:267-273 path, which reuses an hpZ group already in
deepspeed/utils/groups.py rather than asserting). Records, per way, the size of the hpZ group each engine got and
the ZeRO++ groups left after it: "kept" (nothing released) and "released" (autotune's
trial/worker/deepspeed_globals.py release_zeropp_groups after each engine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autotune.infra.atomic import atomic_write_json
from autotune.trial.launch.processes import free_port

RESULTS = Path(__file__).resolve().parent / "results" / "zeropp_group_reuse_cpu.json"
WORLD = 4

_RANK = """
import json, sys, torch, deepspeed
from deepspeed.utils import groups
from autotune.trial.worker.deepspeed_globals import release_zeropp_groups, zeropp_groups_left
release, out = sys.argv[1] == "released", sys.argv[2]
deepspeed.init_distributed("gloo")
engines = []
for hpz in (2, 4):
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
              "zero_optimization": {"stage": 3, "zero_hpz_partition_size": hpz}}
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    engine, *_ = deepspeed.initialize(model=model, config=config)
    got = torch.distributed.get_world_size(groups._get_zero_param_intra_parallel_group())
    loss = engine(torch.randn(1, 64)).sum()
    engine.backward(loss)
    engine.step()
    engine.destroy()
    left = release_zeropp_groups() if release else zeropp_groups_left()
    engines.append({"hpz_asked": hpz, "hpz_group_size": got, "zeropp_groups_left": left})
with open(f"{out}/rank{torch.distributed.get_rank()}.json", "w") as handle:
    json.dump(engines, handle)
"""


def one_way(way: str) -> dict[str, list[dict]]:
    """Each rank writes its own file (ranks sharing torchrun's stdout interleave their lines)."""
    with tempfile.TemporaryDirectory(prefix="zeropp-reuse-") as out:
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={WORLD}"]
        command += [f"--master-port={free_port()}", "--no-python", sys.executable, "-c", _RANK, way, out]
        env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
        ranks = {path.stem.removeprefix("rank"): json.loads(path.read_text()) for path in Path(out).glob("rank*.json")}
    if len(ranks) != WORLD:
        raise SystemExit(f"{way}: {len(ranks)} of {WORLD} ranks reported\n{done.stderr[-3000:]}")
    return dict(sorted(ranks.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    import deepspeed
    import torch

    started = time.monotonic()
    ways = {way: one_way(way) for way in ("kept", "released")}
    atomic_write_json(
        args.out,
        {
            "benchmark": "two hpZ engines (2 then 4) in one process, ZeRO++ groups kept or released (CPU, gloo)",
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "deepspeed": deepspeed.__version__,
            "world_size": WORLD,
            "load_average": list(os.getloadavg()),
            "elapsed_s": round(time.monotonic() - started, 1),
            "ranks": ways,
        },
    )


if __name__ == "__main__":
    main()
