"""`TuneRequest` in typed sections (request/asks.py): every field reachable from the CLI or declared API-only, one
flat name per field, construction and updates by flat name, and the hook's key leaving out what it did before."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

import pytest

from autotune.cli.request import API_ONLY, NOT_OFFERED, offered_fields
from autotune.core.ladder import Rung
from autotune.hook import run as hook_run
from autotune.request import asks
from autotune.request.asks import HardwareAsk, ModelAsk, OutputAsk
from autotune.request.tune_request import SECTION, TuneRequest, flat_fields, section_flat_names

COMMANDS = tuple(NOT_OFFERED)


def test_every_field_of_every_section_is_reachable_from_the_cli_or_declared_api_only() -> None:
    offered = {name for command in COMMANDS for name in offered_fields(command)}
    assert set(flat_fields()) - offered == set(API_ONLY)
    assert not set(API_ONLY) & offered  # no stale declaration: an offered field is not API-only


def test_the_flat_name_table_has_one_name_per_field_of_every_section() -> None:
    sections = [item.metadata[SECTION] for item in fields(TuneRequest)]
    assert len(flat_fields()) == sum(len(fields(kind)) for kind in sections)
    assert flat_fields()["model"].section == "model" and flat_fields()["model"].name == "name"
    assert all(where.name == flat for flat, where in flat_fields().items() if flat != "model")


def test_a_flat_name_two_sections_share_is_refused() -> None:
    @dataclass(frozen=True, kw_only=True)
    class ClashingOutput(OutputAsk):
        gpus: int = 0  # HardwareAsk's

    @dataclass(frozen=True, kw_only=True)
    class ClashingRequest(TuneRequest):
        output: ClashingOutput = field(default_factory=ClashingOutput, metadata={SECTION: ClashingOutput})

    with pytest.raises(TypeError, match="'gpus' is in both hardware and output"):
        flat_fields(ClashingRequest)


def test_a_request_is_built_and_updated_by_flat_name_and_read_by_section() -> None:
    request = TuneRequest.of(model="gpt2", gpus=8, headroom=0.5, rungs=(Rung.Z3,), out="x.json")
    assert request.model == ModelAsk(name="gpt2")
    assert request.hardware == HardwareAsk(gpus=8)
    assert (request.search.headroom, request.search.rungs, request.output.out) == (0.5, (Rung.Z3,), "x.json")
    changed = request.updated(gpus=4, seq_len=128)
    assert (changed.hardware.gpus, changed.model.seq_len, changed.model.name) == (4, 128, "gpt2")
    assert (changed.search, changed.output, changed.training) == (request.search, request.output, request.training)
    assert request.hardware.gpus == 8  # frozen: the update is a new request
    assert TuneRequest.of(**request.flat_values()) == request
    with pytest.raises(TypeError, match="no field 'bogus'"):
        TuneRequest.of(model="gpt2", bogus=1)
    with pytest.raises(TypeError, match="needs model"):
        TuneRequest.of(gpus=1)


def test_the_flat_constructor_of_before_the_sections_is_refused_at_once() -> None:
    """One way to build from flat names (`TuneRequest.of`): the old call fails where it is made, saying so."""
    with pytest.raises(TypeError, match=r"takes a ModelAsk; build a request from flat names with TuneRequest\.of"):
        TuneRequest(model="gpt2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unexpected keyword argument 'gpus'"):
        TuneRequest(model=ModelAsk(name="gpt2"), gpus=8)  # type: ignore[call-arg]
    assert TuneRequest(model=ModelAsk(name="gpt2"), hardware=HardwareAsk(gpus=8)) == TuneRequest.of(
        model="gpt2", gpus=8
    )


def test_the_hook_job_key_leaves_out_the_output_section_and_the_jobs_shape_as_before() -> None:
    before = {"model", "gpus", "nodes", "out", "report_dir", "hf", "use_cache", "cache_dir", "script"}  # 5f36582
    assert set(hook_run._NOT_IN_KEY) == before
    assert set(section_flat_names("output")) <= before


def test_the_section_table_in_asks_says_where_every_field_lives() -> None:
    """The module docstring's table is the map a reader starts from: it names every flat name in its section."""
    said: dict[str, set[str]] = {}
    current = ""
    for row in re.findall(r"^\|(.*)\|$", asks.__doc__ or "", flags=re.M)[2:]:
        where, names = (cell.strip() for cell in row.split("|"))
        current = where.split(":")[0].strip("`") or current
        said.setdefault(current, set()).update(re.findall(r"\b[a-z_]+\b", re.sub(r"\(.*?\)", "", names)))
    expected: dict[str, set[str]] = {}
    for flat, where in flat_fields().items():
        expected.setdefault(where.section, set()).add(flat)
    assert said == expected
