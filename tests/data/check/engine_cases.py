"""Run real DeepSpeed engines on CPU for the configs `autotune check` calls silently wrong.

    python engine_cases.py FIXED_CONFIG.json   # prints one JSON object: case -> what the engine did

One process, one single-rank gloo group, a tiny torch.nn.Linear per case. Optimizers use
`torch_adam` so no DeepSpeed op needs compiling (shm comm is still built once per machine).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import traceback
from typing import Any


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


os.environ.update(
    DS_ACCELERATOR="cpu",
    MASTER_ADDR="127.0.0.1",
    MASTER_PORT=str(_free_port()),
    RANK="0",
    LOCAL_RANK="0",
    WORLD_SIZE="1",
    LOCAL_WORLD_SIZE="1",
)

import deepspeed  # noqa: E402
import torch  # noqa: E402

BASE: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": 2,
    "steps_per_print": 1_000_000,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
}


def _engine(config: dict[str, Any], step: bool = True):
    model = torch.nn.Linear(16, 16)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    if step:
        loss = engine(torch.randn(2, 16)).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    return engine


def _error(error: BaseException) -> dict[str, str]:
    return {"error": type(error).__name__, "message": str(error).splitlines()[0] if str(error) else ""}


def offload_param_at_stage2() -> dict[str, Any]:
    with_param = _engine({**BASE, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})
    without = _engine({**BASE, "zero_optimization": {"stage": 2}})
    return {
        "stage": with_param.zero_optimization_stage(),
        "optimizer": type(with_param.optimizer).__name__,
        "optimizer_without_offload_param": type(without.optimizer).__name__,
        "params_partitioned": any(hasattr(p, "ds_id") for p in with_param.module.parameters()),
        "cpu_offload": with_param.optimizer.cpu_offload,
        "cpu_offload_without_offload_param": without.optimizer.cpu_offload,
    }


def nvme_optimizer_at_stage2(nvme_dir: str) -> dict[str, Any]:
    offload = {"device": "nvme", "nvme_path": nvme_dir}
    engine = _engine({**BASE, "zero_optimization": {"stage": 2, "offload_optimizer": offload}})
    return {
        "optimizer": type(engine.optimizer).__name__,
        "cpu_offload": engine.optimizer.cpu_offload,
        "has_nvme_swapper": any("swapper" in name for name in vars(engine.optimizer)),
        "nvme_dir_written": os.path.isdir(nvme_dir) and bool(os.listdir(nvme_dir)),
    }


def top_level_memory_efficient_linear() -> dict[str, Any]:
    dropped = _engine({**BASE, "memory_efficient_linear": False, "zero_optimization": {"stage": 3}}, step=False)
    placed = _engine({**BASE, "zero_optimization": {"stage": 3, "memory_efficient_linear": False}}, step=False)
    return {
        "top_level": dropped._config.zero_config.memory_efficient_linear,
        "under_zero_optimization": placed._config.zero_config.memory_efficient_linear,
    }


def unknown_top_level_key() -> dict[str, Any]:
    engine = _engine({**BASE, "gradient_clip": 0.25}, step=False)
    return {"gradient_clipping": engine.gradient_clipping()}


def auto_in_zero_field() -> dict[str, Any]:
    engine = _engine({**BASE, "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}, step=False)
    return {"reduce_bucket_size": engine.zero_reduce_bucket_size()}


def auto_in_gradient_clipping() -> dict[str, Any]:
    try:
        engine = _engine({**BASE, "gradient_clipping": "auto"}, step=False)
    except Exception as error:
        return {"initialize": _error(error)}
    try:
        loss = engine(torch.randn(2, 16)).pow(2).mean()
        engine.backward(loss)
        engine.step()
    except Exception as error:
        return {"initialize": "ok", "step": _error(error)}
    return {"initialize": "ok", "step": "ok"}


def auto_in_optimizer_params() -> dict[str, Any]:
    config = {**BASE, "optimizer": {"type": "AdamW", "params": {"lr": "auto", "torch_adam": True}}}
    try:
        _engine(config)
    except Exception as error:
        return _error(error)
    return {"result": "ok"}


def string_number_in_zero_field() -> dict[str, Any]:
    results = {}
    for text in ("1e9", "1000000000"):
        try:
            engine = _engine({**BASE, "zero_optimization": {"stage": 2, "reduce_bucket_size": text}}, step=False)
            results[text] = engine.zero_reduce_bucket_size()
        except Exception as error:
            results[text] = _error(error)
    return results


def fixed_config_trains(path: str) -> dict[str, Any]:
    with open(path) as handle:
        config = json.load(handle)
    try:
        engine = _engine(config)
    except Exception as error:
        return _error(error)
    return {"result": "ok", "stage": engine.zero_optimization_stage()}


def main() -> None:
    fixed_path, nvme_dir = sys.argv[1], sys.argv[2]
    deepspeed.init_distributed(dist_backend="gloo")
    cases = {
        "offload_param_at_stage2": offload_param_at_stage2,
        "nvme_optimizer_at_stage2": lambda: nvme_optimizer_at_stage2(nvme_dir),
        "top_level_memory_efficient_linear": top_level_memory_efficient_linear,
        "unknown_top_level_key": unknown_top_level_key,
        "auto_in_zero_field": auto_in_zero_field,
        "auto_in_gradient_clipping": auto_in_gradient_clipping,
        "auto_in_optimizer_params": auto_in_optimizer_params,
        "string_number_in_zero_field": string_number_in_zero_field,
        "fixed_config_trains": lambda: fixed_config_trains(fixed_path),
    }
    results: dict[str, Any] = {}
    for name, case in cases.items():
        try:
            results[name] = case()
        except Exception:
            results[name] = {"crashed": traceback.format_exc(limit=3)}
    print("ENGINE_RESULTS " + json.dumps(results))


if __name__ == "__main__":
    main()
