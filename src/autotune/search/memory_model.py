"""The memory model the search predicts and learns with, as the search sees it: the real estimate and calibration
functions by default, a fake in tests (tests/fakes/machines.py). Typed by the real functions' signatures, so mypy
checks every call the search makes, keywords included."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from autotune.core.ladder import Candidate
from autotune.estimate import calibrate, calibrate_oom, estimate
from autotune.estimate.estimate_types import Calibration, EstimateSettings, MemoryEstimate
from autotune.hardware.specs import Target
from autotune.models import ModelSummary


class EstimateFn(Protocol):
    """autotune.estimate.estimate's signature: what a memory model the search is given must accept."""

    def __call__(
        self,
        model: ModelSummary,
        target: Target,
        candidate: Candidate,
        settings: EstimateSettings,
        calibration: Calibration | None = None,
    ) -> MemoryEstimate: ...


class CalibrateFn(Protocol):
    """autotune.estimate.calibrate's signature (a measured peak)."""

    def __call__(
        self,
        calibration: Calibration,
        model: ModelSummary,
        target: Target,
        candidate: Candidate,
        settings: EstimateSettings,
        measured_peak_bytes: int,
    ) -> Calibration: ...


class CalibrateOomFn(Protocol):
    """autotune.estimate.calibrate_oom's signature (a lower bound: it ran out of memory)."""

    def __call__(
        self,
        calibration: Calibration,
        model: ModelSummary,
        target: Target,
        candidate: Candidate,
        settings: EstimateSettings,
        limit_bytes: int,
    ) -> Calibration: ...


@dataclass(frozen=True)
class MemoryModel:
    """The memory model the search predicts and learns with; the real one by default, a fake in tests."""

    estimate: EstimateFn = estimate
    calibrate: CalibrateFn = calibrate
    calibrate_oom: CalibrateOomFn = calibrate_oom
