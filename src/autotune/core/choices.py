"""The string choices a tuning names (device, precision, attention, kernels, trial workers), one source each.

Each is a `Literal` type, so a type checker holds every field and parameter that carries one to its values, and a
tuple of the same values read from it (`typing.get_args`), which `request.validate` checks the user's text against
and the CLI shows in --help. A value from outside (an option, a stored report) has its Literal type only once
`validate` has accepted it: the types say what a valid request holds, they check nothing at run time.
"""

from __future__ import annotations

from typing import Literal, TypeGuard, TypeVar, get_args

# "cpu": real trials on DeepSpeed's CPU backend (DS_ACCELERATOR=cpu), where every peak is host memory
Device = Literal["cuda", "cpu"]
Precision = Literal["bf16", "fp16", "fp32"]
# "eager" materialises the s^2 attention scores (estimate/eager_scores.py); "sdpa" and "flash" do not
Attention = Literal["sdpa", "flash", "eager"]
# Fused training kernels the user's training runs: what each keeps for backward is in estimate/kernels.py
Kernels = Literal["stock", "liger", "flash-attn-fused"]
TrialWorkers = Literal["auto", "warm", "fresh"]  # see SearchAsk.trial_workers

DEVICES: tuple[Device, ...] = get_args(Device)
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
ATTENTIONS: tuple[Attention, ...] = get_args(Attention)
KERNELS: tuple[Kernels, ...] = get_args(Kernels)
TRIAL_WORKERS: tuple[TrialWorkers, ...] = get_args(TrialWorkers)

_Choice = TypeVar("_Choice", bound=str)


def is_one_of(value: object, choices: tuple[_Choice, ...]) -> TypeGuard[_Choice]:
    """`value` is one of `choices` (one of the tuples above), so it has that choice's Literal type."""
    return value in choices
