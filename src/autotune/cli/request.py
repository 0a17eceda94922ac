"""The one mapping from a command's options to the `TuneRequest` it asks for.

`tune`, `plan` and `hook` build their request here, and `check` reads a tuning's recorded assumptions back
through the same mapping. It follows the request's sections (request/asks.py) by their fields' flat names
(`flat_fields`, derived from the section dataclasses): every field reads the command parameter of its flat name,
unless `_SOURCES` names another parameter or a conversion (cli/parsing.py). A field a command does not offer is
declared in `NOT_OFFERED` with the reason, one field or a whole section at once (plan offers no output field), and
keeps the request's own default there.
So a new field needs an option or a declared absence in every command: building a request raises otherwise,
and tests/test_cli_request.py checks every command without running one.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from autotune.cli.parsing import command_words, parse_micro_batches, parse_name_list, parse_rung_list
from autotune.request.tune_request import TuneRequest, flat_fields


def _as_given(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class OptionSource:
    """Where one request field comes from: the command's parameter, and what turns its value into the field's."""

    parameter: str
    convert: Callable[[Any], Any] = _as_given


# The fields whose parameter has another name or whose option text is converted; every other field reads the
# parameter of its own name as given.
_SOURCES = {
    "time_budget_s": OptionSource("time_budget"),
    "trial_timeout_s": OptionSource("trial_timeout"),
    "use_cache": OptionSource("no_cache", operator.not_),
    "micro_batches": OptionSource("micro_batches", parse_micro_batches),
    "rungs": OptionSource("rungs", parse_rung_list),
    "lora_targets": OptionSource("lora_targets", parse_name_list),
    "command": OptionSource("command", command_words),
}


def source_of(field: str) -> OptionSource:
    """The parameter a request field is read from, in every command that offers it."""
    return _SOURCES.get(field, OptionSource(field))


_NO_TRIALS = "plan runs no trials"
_WRITES_NOTHING = "plan writes nothing"
_JOBS_GPUS = "the hook tunes on the job's own GPUs (SLURM/torchrun, or --gpus/--nodes as JobOverrides)"

# Per command, the request fields it has no option for, and why: they keep TuneRequest's default there. A key that
# names a section (request/asks.py) declares every field of it.
NOT_OFFERED: dict[str, dict[str, str]] = {
    "tune": {
        "micro_batch": "the search picks the micro-batch; --micro-batches restricts its grid",
        "config": "tune's --config is the config it tunes on (base_config), not one to answer for",
    },
    "plan": {
        "max_trials": _NO_TRIALS,
        "time_budget_s": _NO_TRIALS,
        "trial_timeout_s": _NO_TRIALS,
        "trial_workers": _NO_TRIALS,
        "command": _NO_TRIALS,
        "consumer": _NO_TRIALS,
        "output": f"{_WRITES_NOTHING}, and neither reads nor writes the results cache (tune does)",
        "script": "the script is named in the launch commands tune writes",
        "tokens_per_step": "plan takes the global batch in samples only (--global-batch)",
        "base_config": "plan's --config is the config it answers for (config), not one to tune on",
    },
    "hook": {
        "gpus": _JOBS_GPUS,
        "nodes": _JOBS_GPUS,
        "gpu_type": _JOBS_GPUS,
        "gpu_memory": _JOBS_GPUS,
        "gpu_memory_fraction": _JOBS_GPUS,
        "host_memory": _JOBS_GPUS,
        "cache_dir": "the hook's --cache-dir is the directory every node shares (HookRequest.shared_dir)",
        "use_cache": "the hook always reads and writes the results cache in that directory",
        "hf": "the .hf.json variant is always written (tune keeps --hf as a no-op)",
        "script": "the job's own launch line runs the script",
        "tokens_per_step": "the hook takes the global batch in samples only (--global-batch)",
        "micro_batch": "the hook searches the micro-batch; --micro-batches restricts its grid",
        "config": "the hook's --config is the config it tunes on (base_config), not one to answer for",
    },
}


# Request fields no command offers, by flat name, and why: the Python API (`TuneRequest.of`) alone sets them.
API_ONLY: dict[str, str] = {}


def offered_fields(command: str) -> list[str]:
    """The request fields `command` reads from its options, by flat name in the sections' order."""
    absent = NOT_OFFERED[command]
    table = flat_fields(TuneRequest)
    return [name for name, where in table.items() if name not in absent and where.section not in absent]


def unwired_fields(command: str, parameters: Collection[str]) -> list[str]:
    """The request fields `command` neither reads from one of `parameters` nor declares absent: wiring bugs."""
    return [name for name in offered_fields(command) if source_of(name).parameter not in parameters]


def request_from_options(command: str, options: Mapping[str, Any]) -> TuneRequest:
    """The request `autotune COMMAND` asks for, from its parsed options by parameter name (the command's
    `locals()` before it binds anything else)."""
    if unwired := unwired_fields(command, options.keys()):
        raise TypeError(f"autotune {command} has no option for TuneRequest {unwired}: add one or declare it absent")
    return _built(options, offered_fields(command))


def request_from_given(options: Mapping[str, Any]) -> TuneRequest:
    """The request these options ask for, every field whose option is not among them at TuneRequest's default:
    for options read back from elsewhere (a tuning's record), where a missing one means "as by default"."""
    return _built(options, [name for name in flat_fields(TuneRequest) if source_of(name).parameter in options])


def _built(options: Mapping[str, Any], names: Iterable[str]) -> TuneRequest:
    given = {}
    for name in names:
        source = source_of(name)
        given[name] = source.convert(options[source.parameter])
    return TuneRequest.of(**given)


# A tuning's recorded assumptions (TuneContext.assumptions, written beside its config) -> the option each was.
_RECORDED_OPTIONS = {
    "gpus_per_node": "gpus",
    "nodes": "nodes",
    "gpu_type": "gpu_type",
    "gpu_memory": "gpu_memory",
    "device": "device",
    "seq_len": "seq_len",
    "precision": "precision",
    "attention": "attention",
    "headroom": "headroom",
    "trust_remote_code": "trust_remote_code",
    "optimizer": "optimizer",
    "lora_rank": "lora_rank",
    "lora_targets": "lora_targets",
    "decoder_seq_len": "decoder_seq_len",
    "kernels": "kernels",
}


def recorded_options(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """The options a tuning was given, as far as its record says (a key it lacks or holds empty is left out).

    The record holds the CPU backend's per-rank cap as bytes (`memory_bytes_per_rank`): it is the tuning's
    --memory-budget there; on GPUs it is the planned GPU's memory, which --gpu-type/--gpu-memory already say."""
    options = {
        option: recorded[key] for key, option in _RECORDED_OPTIONS.items() if recorded.get(key) not in (None, "", [])
    }
    options["model"] = recorded["model"]  # a record without its model is not one autotune wrote
    per_rank = recorded.get("memory_bytes_per_rank")
    if per_rank and options.get("device") == "cpu":
        options["memory_budget"] = f"{per_rank}B"
    return options
