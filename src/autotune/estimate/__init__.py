"""The memory model: per-GPU peak, host RAM and NVMe for a candidate, before any trial runs."""

from autotune.estimate.calibration import calibrate, calibrate_oom
from autotune.estimate.estimate_types import Calibration, EstimateSettings, MemoryEstimate, Verdict
from autotune.estimate.peak import check_fit, estimate
from autotune.estimate.planning import Plan, PlanRow, eligible_micro_batches, largest_micro_batch, plan

__all__ = [
    "Calibration",
    "EstimateSettings",
    "MemoryEstimate",
    "Plan",
    "PlanRow",
    "Verdict",
    "calibrate",
    "calibrate_oom",
    "check_fit",
    "eligible_micro_batches",
    "estimate",
    "largest_micro_batch",
    "plan",
]
