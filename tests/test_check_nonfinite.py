"""Issue 46: a config holding NaN/Infinity is read as Python's json reads it, and check says what DeepSpeed does.

HF Trainer and accelerate json.load the file (NaN becomes float('nan')); DeepSpeed given the path reads it with
hjson.load (deepspeed/runtime/config.py:444 in 0.19.8), where NaN is a quoteless string running to the end of
its line. Before, check answered "not valid JSON or hjson: Bad key name" and exited 2, as if the file were
unreadable.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.dsconfig.loading import deepspeed_file_reading, load_config


def _check_json(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    with pytest.raises(SystemExit) as exited:
        main(["check", str(path), "--json"])
    return int(exited.value.code or 0), json.loads(capsys.readouterr().out)


def test_nan_on_one_line_is_read_and_diagnosed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ds.json"
    path.write_text('{"train_micro_batch_size_per_gpu": 1, "gradient_clipping": NaN}')
    loaded = load_config(path)
    assert math.isnan(loaded.config["gradient_clipping"])  # as json.load (HF Trainer, accelerate) reads it
    code, report = _check_json(path, capsys)
    found = [f for f in report["findings"] if f["rule"] == "non-finite"]
    assert code == 1 and [f["path"] for f in found] == ["gradient_clipping"]
    assert "float('NaN')" in found[0]["message"] and "(hjson.load) refuses it: Bad key name" in found[0]["message"]


def test_infinity_alone_on_its_line_is_a_string_to_deepspeed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = '{\n  "train_micro_batch_size_per_gpu": 1,\n  "gradient_clipping": Infinity\n}\n'
    path = tmp_path / "ds.json"
    path.write_text(text)
    assert deepspeed_file_reading(text) == "DeepSpeed given the file's path (hjson.load) reads 'Infinity' as strings"
    import hjson

    assert hjson.loads(text)["gradient_clipping"] == "Infinity"  # the installed hjson, as DeepSpeed calls it
    code, report = _check_json(path, capsys)
    found = [f for f in report["findings"] if f["rule"] == "non-finite"]
    assert code == 1 and found and "reads 'Infinity' as strings" in found[0]["message"]
