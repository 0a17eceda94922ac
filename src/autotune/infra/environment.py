"""The one place autotune sets DS_ACCELERATOR in its own process, and puts it back.

DeepSpeed picks its accelerator from DS_ACCELERATOR at the first `get_accelerator()` call and caches it
in `deepspeed.accelerator.real_accelerator.ds_accelerator` (deepspeed/accelerator/real_accelerator.py,
`get_accelerator`). Parsing a config needs no device, so autotune parses with the CPU accelerator, and
never touches CUDA in the tuner's process. A user who calls `autotune.tune()` and then
`deepspeed.initialize` in the same process must still get their own accelerator: so the variable and
DeepSpeed's cached choice are both restored on the way out. Trial subprocesses get DS_ACCELERATOR in
their environment instead (trial/launch/processes.py).
"""

from __future__ import annotations

import io
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout, suppress

ACCELERATOR_ENV = "DS_ACCELERATOR"
_ACCELERATOR_MODULE = "deepspeed.accelerator.real_accelerator"


@contextmanager
def deepspeed_accelerator(device: str = "cpu") -> Iterator[None]:
    """DeepSpeed in this process sees `device` inside the block; the caller's choice is back afterwards."""
    before_env = os.environ.get(ACCELERATOR_ENV)
    module = sys.modules.get(_ACCELERATOR_MODULE)
    before_cached = getattr(module, "ds_accelerator", None) if module else None
    os.environ[ACCELERATOR_ENV] = device
    if module is not None and before_cached is not None and getattr(before_cached, "_name", device) != device:
        vars(module)["ds_accelerator"] = None  # re-detect for the block
    try:
        yield
    finally:
        if before_env is None:
            os.environ.pop(ACCELERATOR_ENV, None)
        else:
            os.environ[ACCELERATOR_ENV] = before_env
        module = sys.modules.get(_ACCELERATOR_MODULE)
        if module is not None:
            vars(module)["ds_accelerator"] = before_cached  # None: the next get_accelerator() detects afresh


@contextmanager
def preserved_environment() -> Iterator[None]:
    """Whatever a step sets in os.environ (a library's import side effects included) is undone afterwards."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for name in set(os.environ) - set(saved):
            del os.environ[name]
        for name, value in saved.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


def select_accelerator(device: str) -> None:
    """In a process autotune owns (a trial worker, the op builder): DeepSpeed uses `device` from now on."""
    os.environ[ACCELERATOR_ENV] = device


def parse_without_device() -> None:
    """Before DeepSpeed is imported only to parse or estimate: the CPU accelerator unless the caller chose one.

    Library entry points that do this (`tune`, `check_config`) run inside `deepspeed_accelerator` or
    `preserved_environment`, so the caller's environment is unchanged afterwards.
    """
    os.environ.setdefault(ACCELERATOR_ENV, "cpu")
    deepspeed_imported_off_stdout()


def deepspeed_imported_off_stdout() -> None:
    """Import DeepSpeed (once per process) with its import-time output dropped and its logger then on stderr, so
    `--json` output stays JSON and bad input stays one line.

    Why: DeepSpeed's logger is a StreamHandler bound to the sys.stdout it sees when deepspeed.utils.logging is
    first imported (deepspeed 0.19.8 utils/logging.py:45, 0.15.4 :69), and it logs while importing: 0.15.4's
    logger is at INFO (:82) and logs "Setting ds_accelerator to cpu (override)" (accelerator/real_accelerator.py:219;
    0.19.8 logs it too, real_accelerator.py:263, below its logger's WARNING level). That line says nothing the user
    asked for; what DeepSpeed logs later (warnings) goes to stderr, never into the JSON a script reads from stdout.
    Not installed: the caller's own import raises as before.
    """
    if "deepspeed" in sys.modules:
        return
    with redirect_stdout(io.StringIO()), suppress(ImportError):
        import deepspeed  # noqa: F401
        from deepspeed.utils import logger

        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setStream(sys.stderr)
