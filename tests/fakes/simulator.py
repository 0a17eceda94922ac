"""The simulated GPU cluster of benchmarks/gpu_sim for tests: a scenario by name and its simulated machine.

The benchmarks are imported as they run (benchmarks/ on sys.path), when first asked for, so importing this module
has no effect on its own.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _benchmarks_importable() -> None:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))


def scenario_named(name: str) -> Any:
    """The gpu_sim/scenarios.py scenario called `name`."""
    _benchmarks_importable()
    from gpu_sim.scenarios import SCENARIOS

    return next(s for s in SCENARIOS if s.name == name)


def simulated_machine(name: str) -> Any:
    """The simulated cluster of scenario `name`, as search_quality.py builds it."""
    _benchmarks_importable()
    from search_quality import cluster

    return cluster(scenario_named(name))[0]
