"""The base config's say over the request: the global batch, precision and optimizer it fixes are the job's.

The base itself (reading it, laying the tuned keys over it) is `autotune.dsconfig.base_config`; here only what it
changes
in the one validated request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.dsconfig.base_config import agreed, base_facts
from autotune.errors import UserError
from autotune.request.tune_request import TuneRequest


def request_on_base(request: TuneRequest, base: Mapping[str, Any], world_size: int) -> tuple[TuneRequest, list[str]]:
    """The request with what the base fixes: its global batch, precision and optimizer (the job's, not new
    choices); a command-line value that contradicts the base is one line, exit 2."""
    facts = base_facts(base, world_size)
    if facts.global_batch is not None and request.training.tokens_per_step is not None:
        raise UserError("the base config fixes the global batch; --tokens-per-step does not apply")
    notes = list(facts.notes)
    if facts.optimizer is not None and facts.optimizer != request.training.optimizer:
        notes.append(
            f"the base config's optimizer ({facts.optimizer}) is tuned, not --optimizer {request.training.optimizer}"
        )
    changed = request.updated(
        global_batch=agreed("--global-batch", request.training.global_batch, facts.global_batch),
        precision=agreed("--precision", request.training.precision, facts.precision),
        optimizer=facts.optimizer or request.training.optimizer,
    )
    return changed, notes
