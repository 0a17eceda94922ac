"""`autotune hook`: tune once per job right before training, safely from every node at once."""

from autotune.hook.coordinate import HookError, HookRecord
from autotune.hook.env import JobEnv, JobOverrides, detect_job_env
from autotune.hook.run import HookRequest, HookResult, run_hook

__all__ = [
    "HookError",
    "HookRecord",
    "HookRequest",
    "HookResult",
    "JobEnv",
    "JobOverrides",
    "detect_job_env",
    "run_hook",
]
