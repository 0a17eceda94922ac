"""The typed report (autotune.report.data) against reports today's code wrote: read back strictly, written back
byte for byte, rendered to the same markdown; a report that does not parse is refused with one error, and a
stored answer whose report does not parse is a results-cache miss, never a crash.

tests/data/report/ holds real outputs of `autotune tune ... --no-cache` (2026-11-27, from a3fb60f: the code before
the report was typed):
- demo.*: the README's CPU demo (`--model gpt2-small-demo --device cpu --memory-budget 2GiB --seq-len 128
  --precision fp32 --rungs z0,z2 --micro-batches 4,8`), real DeepSpeed trials;
- plan.*: plan-only (`--model gpt2 --gpus 8 --gpu-type a100-80gb`), with the plan and every mode predicted;
- nofit.*: nothing fits (`--model llama-2-70b --gpus 1 --gpu-type rtx-4090 --rungs z0,z2`): exit 3, no choice;
- own.*: own-command mode (the README's tiny-gpt2 `-- python3 tests/scripts/user_jobs/plain_deepspeed.py ...`).
A change to what a report holds (a new field of TrialResult, say) changes these files on purpose: regenerate them
with the commands above, or add the key with the value the new code writes, and say so in the commit.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
from tests.fakes.launchers import CountingLauncher
from tests.fakes.reports import DATA, golden_report, golden_text
from tests.fakes.requests import tune_request

from autotune import tune
from autotune.core.ladder import Candidate, Mode, Rung
from autotune.errors import MalformedReportError, UserError
from autotune.report.assumptions import assumptions_record
from autotune.report.data import TuneReport
from autotune.report.markdown import render_markdown, write_report
from autotune.search.cache import ResultsCache, StoredAnswer

GOLDEN = sorted(path.name.split(".")[0] for path in DATA.glob("*.autotune-report.json"))


@pytest.mark.parametrize("name", GOLDEN)
def test_a_written_report_reads_back_and_writes_back_byte_for_byte(name: str) -> None:
    text, data = golden_text(name)
    report = TuneReport.from_json(data)
    assert json.dumps(report.to_json(), indent=2) + "\n" == text  # same keys, same order, same values


@pytest.mark.parametrize("name", GOLDEN)
def test_the_typed_report_renders_the_markdown_today_s_code_wrote(name: str) -> None:
    report = TuneReport.from_json(golden_text(name)[1])
    assert render_markdown(report) == (DATA / f"{name}.autotune-report.md").read_text()


@pytest.mark.parametrize("name", GOLDEN)
def test_write_report_writes_the_same_json_and_markdown(name: str, tmp_path: Path) -> None:
    """The writer from the typed value: a report without its picture gets it back (here: none drawn again, as
    on a cache hit), and both files equal what the untyped writer produced."""
    text, data = golden_text(name)
    report = TuneReport.from_json(data)
    picture = report.picture
    assert picture is not None
    if picture.path:  # keep the picture the golden names, as a cache hit does (redraw=False)
        (tmp_path / Path(picture.path).name).write_bytes(b"png")
        report = replace(report, picture=None)
        expected = text.replace(json.dumps(picture.path), json.dumps(str(tmp_path / Path(picture.path).name)))
    else:
        report = replace(report, picture=None)
        expected = text
    md_path, json_path = write_report(report, tmp_path, redraw=False)
    assert json_path.read_text() == expected
    assert md_path.read_text() == (DATA / f"{name}.autotune-report.md").read_text()


@pytest.mark.parametrize("name", [n for n in GOLDEN if (DATA / f"{n}.ds_config.autotune.json").exists()])
def test_the_assumptions_beside_the_config_are_what_today_s_code_wrote(name: str) -> None:
    record = json.loads((DATA / f"{name}.ds_config.autotune.json").read_text())
    assert assumptions_record(golden_report(name)) == record


def _without(data: dict, *path: str) -> dict:
    data = json.loads(json.dumps(data))
    *parents, last = path
    node = data
    for key in parents:
        node = node[key]
    del node[last]
    return data


def _with(data: dict, value: object, *path: str | int) -> dict:
    data = json.loads(json.dumps(data))
    *parents, last = path
    node = data
    for key in parents:
        node = node[key]
    node[last] = value
    return data


_, DEMO = golden_text("demo")

MALFORMED = {
    "missing top-level key": _without(DEMO, "stop_reason"),
    "unknown top-level key": {**DEMO, "extra": 1},
    "string for an int": _with(DEMO, "1024", "seq_len"),
    "bool for an int": _with(DEMO, True, "limit_bytes"),
    "unknown stop reason": _with(DEMO, "because", "stop_reason"),
    "choice missing its description": _without(DEMO, "choice", "description"),
    "choice with an unknown rung": _with(DEMO, "z9", "choice", "rung"),
    "trial result with an unknown key": _with(DEMO, 1, "trials", 0, "result", "surprise"),
    "trial result with a string speed": _with(DEMO, "3.4", "trials", 0, "result", "samples_per_s"),
    "trial with a classic mode written out": _with(DEMO, Mode().to_dict(), "trials", 0, "candidate", "mode"),
    "trial with a mode missing a key": _with(DEMO, {"offload_ratio": 0.5}, "trials", 0, "candidate", "mode"),
    "assumptions missing a key": _without(DEMO, "assumptions", "kernels"),
    "a device that is not a choice": _with(DEMO, "tpu", "assumptions", "device"),
    "a precision that is not a choice": _with(DEMO, "fp64", "precision"),
    "verdict speed interval of strings": _with(DEMO, ["a", "b"], "verdict", "speed", "interval"),
    "notes not a list": _with(DEMO, "one note", "notes"),
    "launch with an unknown launcher": _with(DEMO, "x", "launch", "mpirun"),
    "not an object": [],
}


@pytest.mark.parametrize("data", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_report_raises_one_project_error(data: object) -> None:
    with pytest.raises(MalformedReportError) as raised:
        TuneReport.from_json(data)
    assert isinstance(raised.value, UserError) and raised.value.exit_code == 2
    assert str(raised.value).startswith("report ")


def test_the_error_names_where_the_report_is_wrong() -> None:
    with pytest.raises(MalformedReportError, match=r"TuneReport.trials\[0\].predicted_peak_bytes: expected int"):
        TuneReport.from_json(_with(DEMO, "1", "trials", 0, "predicted_peak_bytes"))


def test_a_choice_outside_its_literal_is_named_with_the_choices() -> None:
    with pytest.raises(MalformedReportError, match=r"TuneReport.assumptions.kernels: expected one of stock, liger"):
        TuneReport.from_json(_with(DEMO, "triton", "assumptions", "kernels"))


def test_parts_only_a_finished_tuning_has_are_absent_not_null() -> None:
    """batch, training and own_command are absent from a nothing-fits report, as before; the picture is added by
    the writer: a report without one writes no key."""
    _, nofit = golden_text("nofit")
    report = TuneReport.from_json(nofit)
    assert report.batch is None and report.training is None and report.own_command is None
    bare = replace(report, picture=None).to_json()
    assert "batch" not in bare and "picture" not in bare and list(bare)[-1] == "nothing_fits_reason"
    with pytest.raises(MalformedReportError, match="batch"):
        TuneReport.from_json({**nofit, "batch": None})  # absent, not null


def _stored_answer() -> StoredAnswer:
    report = golden_report("demo")
    assert report.choice is not None
    return StoredAnswer(
        candidate=report.choice.candidate,
        ds_config={"train_batch_size": 8},
        report=report,
        limit_bytes=report.limit_bytes,
        memory_bound=False,
    )


def test_the_results_cache_stores_and_reads_the_answer_through_its_types(tmp_path: Path) -> None:
    cache = ResultsCache(tmp_path / "results.sqlite")
    answer = _stored_answer()
    cache.put_recommendation("key", answer)
    assert cache.recommendation("key") == answer
    assert answer.candidate == Candidate(Rung.Z0, 8, False)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda stored: _without(stored, "report", "verdict"),
        lambda stored: _with(stored, "fast", "report", "choice", "samples_per_s"),
        lambda stored: _with(stored, {"x": 1}, "report", "host_need"),
        lambda stored: _without(stored, "memory_bound"),
        lambda stored: {**stored, "written_by": "another version"},
    ],
    ids=["report-missing-verdict", "report-string-speed", "report-bad-host-need", "missing-memory-bound", "unknown"],
)
def test_a_stored_answer_whose_report_does_not_parse_is_a_miss(tmp_path: Path, tamper, caplog) -> None:
    cache = ResultsCache(tmp_path / "results.sqlite")
    stored = _stored_answer().to_json()
    with sqlite3.connect(cache.path) as db:
        row = cache.recommendation_row("key", json.dumps(tamper(stored)))  # signed by us: only the content is wrong
        db.execute("INSERT INTO signed_recommendations VALUES (?, ?, ?, ?)", row)
    with caplog.at_level(logging.WARNING):
        assert cache.recommendation("key") is None
    assert "dropped a cached recommendation" in caplog.text
    with sqlite3.connect(cache.path) as db:  # deleted, so the next run does not meet it again
        assert db.execute("SELECT COUNT(*) FROM signed_recommendations").fetchone()[0] == 0


def test_tune_writes_the_report_it_returns_and_a_cache_hit_returns_the_same(tmp_path: Path) -> None:
    request = tune_request(tmp_path, micro_batches=(1, 2, 4))
    first = tune(request, launcher=CountingLauncher())
    assert first.report is not None and first.report_json_path is not None
    written = TuneReport.from_json(json.loads(first.report_json_path.read_text()))
    assert written.picture is not None and replace(written, picture=None) == first.report
    hit = tune(request, launcher=CountingLauncher())
    assert hit.from_cache and hit.report is not None and hit.report.from_cache and hit.report.trials_launched == 0
    as_measured = {"from_cache": False, "trials_launched": first.report.trials_launched, "elapsed_s": 0.0}
    assert replace(hit.report, **as_measured) == replace(first.report, elapsed_s=0.0)  # all else as stored
