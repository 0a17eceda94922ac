"""Build DeepSpeed's JIT ops before any trial needs them.

On a fresh machine the first trial compiles DeepSpeed ops (on CPU: shm comm at process-group init,
fused Adam, CPU Adam for offload; on GPU: fused Adam, CPU Adam): minutes of ninja that a trial
timeout must not absorb. Worse, a trial killed mid-build leaves torch's build lock behind and every
later trial waits on it forever (torch/utils/file_baton.py `FileBaton.wait` polls while the file
exists). Built ops are cached where torch puts them (`extensions_dir`: TORCH_EXTENSIONS_DIR, else
$XDG_CACHE_HOME/torch_extensions, default ~/.cache/torch_extensions).

Files existing is not enough: torch re-builds an op whose sources, flags or torch version differ from
the build's (cpp_extension `_jit_compile` version bump), e.g. ops built by another environment. So
`ensure_ops_ready` LOADS every op in a child process with the trial's interpreter and environment,
building there under its own long timeout, after reporting and clearing build locks older than any
build takes.

    python -m autotune.trial.worker.ops_build --device cpu      # prints seconds per op
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

# The DeepSpeed op builders a trial loads, per accelerator.
TRIAL_OPS = {
    "cpu": ("ShareMemCommBuilder", "FusedAdamBuilder", "CPUAdamBuilder"),
    "cuda": ("FusedAdamBuilder", "CPUAdamBuilder"),
}


# The directory names the built extensions get under torch's extensions cache.
BUILT_NAME = {
    "ShareMemCommBuilder": "deepspeed_shm_comm",
    "FusedAdamBuilder": "fused_adam",
    "CPUAdamBuilder": "cpu_adam",
}
BUILT_NAMES = {device: tuple(BUILT_NAME[op] for op in ops) for device, ops in TRIAL_OPS.items()}
# Only a trial whose optimizer step runs on the host loads DeepSpeedCPUAdam (ops/adam/cpu_adam.py, built by
# CPUAdamBuilder); the others step with FusedAdam (on the CPU backend too: tests/test_launch_paths.py).
HOST_OPTIMIZER_OPS = ("CPUAdamBuilder",)


def ops_for(device: str, host_optimizer: bool) -> tuple[str, ...]:
    """The op builders a trial loads: all of TRIAL_OPS with optimizer offload, else all but CPU Adam."""
    return tuple(name for name in TRIAL_OPS[device] if host_optimizer or name not in HOST_OPTIMIZER_OPS)


def ops_built(device: str, names: tuple[str, ...] = ()) -> bool:
    """Whether every op (`names`, default all a trial may load) is already compiled, judged from torch's
    extensions cache; cheap."""
    base = extensions_dir()
    kind = "cpu" if device == "cpu" else "cu"
    return all(
        any(base.glob(f"py*_{kind}*/{name}/{name}.so")) or any(base.glob(f"{name}/{name}.so"))
        for name in (BUILT_NAME[op] for op in names or TRIAL_OPS[device])
    )


# A build lock older than this is stale: first-ever builds of the trial ops took 3-5 min on 2 cores
# (our measurement) and DeepSpeed's slowest op (async_io) about 6 min (shared/deepspeed-notes.md);
# twice the slowest.
STALE_LOCK_S = 12 * 60.0


def extensions_dir(env: Mapping[str, str] | None = None) -> Path:
    """The directory torch builds and loads the ops in, found as torch 2.13 finds it: TORCH_EXTENSIONS_DIR when set
    (torch/utils/cpp_extension.py:2800 `_get_build_directory`), else the real path of `torch_extensions` under the
    user cache directory (cpp_extension.py:520 `get_default_build_root`): $XDG_CACHE_HOME, default ~/.cache, on
    Linux, ~/Library/Caches on macOS (torch/_appdirs.py:344-349 `user_cache_dir`)."""
    values = os.environ if env is None else env
    if given := values.get("TORCH_EXTENSIONS_DIR"):
        return Path(given)
    if sys.platform == "darwin":
        cache = os.path.expanduser("~/Library/Caches")
    else:
        cache = values.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
    return Path(os.path.realpath(os.path.join(cache, "torch_extensions")))


def build_locks(device: str, env: Mapping[str, str] | None = None) -> list[Path]:
    """torch's build-lock files for the ops a trial loads (`<extensions dir>/[py*/]<op>/lock`)."""
    base = extensions_dir(env)
    found: list[Path] = []
    for name in BUILT_NAMES[device]:
        found += [*base.glob(f"*/{name}/lock"), *base.glob(f"{name}/lock")]
    return sorted(found)


def clear_stale_locks(
    device: str, env: Mapping[str, str] | None = None, max_age_s: float = STALE_LOCK_S, now: float | None = None
) -> tuple[list[str], list[Path]]:
    """Remove build locks older than `max_age_s` (a killed build's leftovers); (what was done, locks still
    held by a build that may be running)."""
    now = time.time() if now is None else now
    cleared: list[str] = []
    held: list[Path] = []
    for lock in build_locks(device, env):
        try:
            age = now - lock.stat().st_mtime
        except FileNotFoundError:
            continue
        if age > max_age_s:
            lock.unlink(missing_ok=True)
            cleared.append(f"removed a stale torch-extensions build lock {lock} ({age / 60:.0f} min old)")
        else:
            held.append(lock)
    return cleared, held


def ensure_ops_ready(
    device: str,
    env: dict[str, str] | None = None,
    python: str = sys.executable,
    timeout_s: float = 3600.0,
    report: Callable[[str], None] = lambda message: None,
    names: tuple[str, ...] = (),
) -> dict[str, float]:
    """Load every trial op (`names`, default all) in a child with the trial's interpreter and environment
    (building if needed), so no trial builds or waits on a lock; seconds per op. Raises RuntimeError with
    the reason."""
    env = {**(os.environ if env is None else env), "DS_ACCELERATOR": device}
    cleared, held = clear_stale_locks(device, env)
    for line in cleared:
        report(line)
    if held:
        report(f"waiting for a torch-extensions build in progress (lock {held[0]})")
    try:
        return prebuild_ops(device, python, timeout_s, env, report=report, names=names)
    except subprocess.TimeoutExpired:
        locks = build_locks(device, env)
        why = f"; build lock {locks[0]} is still held (remove it if no build is running)" if locks else ""
        raise RuntimeError(f"DeepSpeed ops for {device} were not ready within {timeout_s:.0f} s{why}") from None


def prebuild_ops(
    device: str = "cpu",
    python: str = sys.executable,
    timeout_s: float = 3600.0,
    env: dict[str, str] | None = None,
    report: Callable[[str], None] = lambda message: None,
    names: tuple[str, ...] = (),
) -> dict[str, float]:
    """In child processes, so the caller never imports torch: one per op, all at once, a line as each is ready;
    seconds per op (a few each once cached). Each op builds in its own directory under its own torch build
    lock, so the builds do not interfere; run one after another they took the sum of their times.

    The children write to unnamed temp files, not pipes: a build's compiler output can fill a pipe that
    nobody reads until the child exits, and the child would then wait forever."""
    env = {**(os.environ if env is None else env), "DS_ACCELERATOR": device}
    started = time.monotonic()
    seconds: dict[str, float] = {}
    with contextlib.ExitStack() as files:

        def log() -> IO[str]:
            return files.enter_context(tempfile.TemporaryFile("w+"))

        logs = {name: (log(), log()) for name in names or TRIAL_OPS[device]}
        command = [python, "-m", "autotune.trial.worker.ops_build", "--device", device, "--op"]
        children = {name: subprocess.Popen([*command, name], env=env, stdout=out, stderr=err, text=True)
                    for name, (out, err) in logs.items()}  # fmt: skip
        try:
            while children:
                for name, child in list(children.items()):
                    if child.poll() is not None:
                        del children[name]
                        seconds |= _op_outcome(child.returncode, *logs[name], device)
                        report(f"DeepSpeed op {name} ready after {time.monotonic() - started:.0f} s")
                if children and time.monotonic() - started > timeout_s:
                    raise subprocess.TimeoutExpired(command, timeout_s)
                time.sleep(0.2)
        finally:
            for child in children.values():  # on a timeout or an error: no build is left running
                child.kill()
                child.wait()
    return seconds


def _op_outcome(returncode: int, out: IO[str], err: IO[str], device: str) -> dict[str, float]:
    out.seek(0)
    lines = out.read().strip().splitlines()
    if returncode != 0 or not lines:
        err.seek(0)
        tail = (err.read().strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"building DeepSpeed ops for {device} failed: {tail}")
    return json.loads(lines[-1])
