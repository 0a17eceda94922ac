"""The installed versions read in one place, and the features gated on a newer DeepSpeed than the floor."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import autotune
import autotune.core.versions
from autotune.cli import main
from autotune.core.ladder import Mode, Rung
from autotune.core.versions import (
    DEEPSPEED_READ_AGAINST,
    SUPER_OFFLOAD,
    ZENFLOW,
    installed,
    read_against_note,
    version_tuple,
)
from autotune.modes.applies import ModeFacts, considered_modes, mode_applies
from autotune.request.context import TuneContext
from autotune.request.tune_request import TuneRequest


def test_version_tuple_reads_local_and_pre_release_suffixes() -> None:
    assert version_tuple("2.13.0+cpu") == (2, 13, 0)
    assert version_tuple("0.17.6rc1") == (0, 17, 6)
    assert version_tuple("4.57.6.dev0") == (4, 57, 6)
    assert version_tuple(None) is None
    assert version_tuple("unknown") is None


def test_installed_reads_metadata_and_none_for_absent_packages() -> None:
    assert version_tuple(installed("pytest")) is not None
    assert installed("surely-not-an-installed-distribution") is None


def test_a_feature_names_the_version_it_needs_and_the_one_installed() -> None:
    assert ZENFLOW.missing("0.17.6") == "ZenFlow needs DeepSpeed >= 0.19.8; you have 0.17.6: not searched"
    assert ZENFLOW.missing("0.19.8") is None
    assert SUPER_OFFLOAD.missing("0.17.6") == "SuperOffload needs DeepSpeed >= 0.18.0; you have 0.17.6: not searched"
    assert SUPER_OFFLOAD.missing(None) is None  # not installed (a login node's plan): the cluster's version decides


def _zenflow_option(deepspeed_version: str | None):
    facts = ModeFacts(allow_approximate=True, deepspeed_version=deepspeed_version)
    options = considered_modes(Rung.Z2_OFFLOAD_OPT, facts)
    return next(option for option in options if option.mode == Mode(zenflow=True)), facts


def test_zenflow_is_not_searched_on_a_deepspeed_that_predates_it() -> None:
    option, facts = _zenflow_option("0.16.9")
    assert not option.applies
    assert option.reason == "ZenFlow needs DeepSpeed >= 0.19.8; you have 0.16.9: not searched"
    assert not mode_applies(Rung.Z2_OFFLOAD_OPT, Mode(zenflow=True), facts)
    assert _zenflow_option("0.19.8")[0].applies


def test_super_offload_is_not_searched_on_a_deepspeed_that_predates_it() -> None:
    facts = ModeFacts(superchip=True, allow_approximate=True, deepspeed_version="0.17.6")
    option = next(o for o in considered_modes(Rung.Z3_OFFLOAD_OPT, facts) if o.mode == Mode(super_offload=True))
    assert not option.applies
    assert option.reason.startswith("SuperOffload needs DeepSpeed >= 0.18.0; you have 0.17.6")


def test_a_deepspeed_other_than_the_one_read_against_is_said_once_and_the_same_one_not_at_all() -> None:
    assert read_against_note(DEEPSPEED_READ_AGAINST) is None
    assert read_against_note(f"{DEEPSPEED_READ_AGAINST}+local") is None
    assert read_against_note(None) is None  # not installed: a login node that only plans
    note = read_against_note("0.17.6")
    assert note is not None and "DeepSpeed 0.17.6 is installed" in note and f"read in {DEEPSPEED_READ_AGAINST}" in note


def test_plan_and_tune_say_a_differing_deepspeed_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def plan_notes() -> list[str]:
        with pytest.raises(SystemExit):
            main(["plan", "--model", "tiny-gpt2", "--gpu-type", "a100-80gb", "--json"])
        return json.loads(capsys.readouterr().out)["notes"]

    request = TuneRequest.of(model="tiny-gpt2", gpu_type="a100-80gb")
    for have, said in (("0.17.6", 1), (DEEPSPEED_READ_AGAINST, 0)):
        monkeypatch.setattr(autotune.core.versions, "installed", {"deepspeed": have}.get)
        assert sum("DeepSpeed facts" in note for note in plan_notes()) == said
        assert sum("DeepSpeed facts" in note for note in TuneContext.build(request, outputs=False).notes) == said


def test_no_code_outside_versions_py_holds_the_read_against_release() -> None:
    """Source comments cite DeepSpeed lines by the release they were read in; code compares with the constant."""
    found = []
    for path in sorted(Path(autotune.__file__).parent.rglob("*.py")):
        if path.name == "versions.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == DEEPSPEED_READ_AGAINST:
                found.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Tuple) and ".".join(str(getattr(e, "value", "")) for e in node.elts) == (
                DEEPSPEED_READ_AGAINST
            ):
                found.append(f"{path.name}:{node.lineno}")
    assert not found, found
