"""Hostile input to `autotune check`: one line on stderr, exit 2, no traceback, nothing written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.cli import main

OK = '{"train_micro_batch_size_per_gpu": 1}'


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(args)
    captured = capsys.readouterr()
    return int(exited.value.code), captured.out, captured.err


def assert_one_line_exit_2(code: int, out: str, err: str, expected: str) -> None:
    assert code == 2, (out, err)
    assert out == ""
    assert err.startswith("autotune: error: ") and err.count("\n") == 1, err
    assert expected in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("deep.json", '{"a":' * 490 + "1" + "}" * 490, "nested too deeply"),
        ("deep100.json", '{"a":' * 100 + "1" + "}" * 100, "nested more than"),
        ("deeplist.json", '{"a":' + "[" * 5000 + "]" * 5000 + "}", "nested too deeply"),
        ("empty.json", "", "is empty"),
        ("blank.json", "  \n\t\n", "is empty"),
        ("list.json", "[1, 2]", "JSON object at the top level"),
        ("broken.json", "{not json", "not valid JSON or hjson"),
        ("deep.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config: " + "[" * 3000 + "]" * 3000, "nested too deeply"),
        ("nods.yaml", "distributed_type: MULTI_GPU\nnum_processes: 2\n", "without DeepSpeed"),
        ("bad.yaml", "a: [1, 2\n", "not valid YAML"),
    ],
)
def test_unparseable_configs(tmp_path: Path, capsys, name: str, content: str, expected: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    assert_one_line_exit_2(*run(["check", str(path)], capsys), expected)


def test_not_utf8(tmp_path: Path, capsys) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"a": "\xe9"}')
    assert_one_line_exit_2(*run(["check", str(path)], capsys), "not UTF-8")


def test_directory_device_and_fifo_are_refused_without_reading(tmp_path: Path, capsys) -> None:
    assert_one_line_exit_2(*run(["check", str(tmp_path)], capsys), "is a directory")
    assert_one_line_exit_2(*run(["check", "/dev/zero"], capsys), "not a regular file")  # would never end
    fifo = tmp_path / "ds.json"
    os.mkfifo(fifo)
    assert_one_line_exit_2(*run(["check", str(fifo)], capsys), "not a regular file")  # open() would block


def test_oversized_file(tmp_path: Path, capsys) -> None:
    path = tmp_path / "huge.json"
    with open(path, "wb") as handle:
        handle.truncate(17 * 1024 * 1024)
    assert_one_line_exit_2(*run(["check", str(path)], capsys), "a DeepSpeed config is a few KiB")


def test_accelerate_yaml_pointing_at_a_missing_file(tmp_path: Path, capsys) -> None:
    path = tmp_path / "acc.yaml"
    path.write_text("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: nowhere.json\n")
    assert_one_line_exit_2(*run(["check", str(path)], capsys), "not found")


@pytest.mark.parametrize("kind", ["directory", "fifo", "device", "under-a-file"])
def test_fix_output_that_can_never_be_written(tmp_path: Path, capsys, kind: str) -> None:
    config = tmp_path / "ds.json"
    config.write_text(OK)
    target = {
        "directory": tmp_path,
        "device": Path("/dev/null"),
        "fifo": tmp_path / "out.json",
        "under-a-file": config / "out.json",
    }[kind]
    if kind == "fifo":
        os.mkfifo(target)
    code, out, err = run(["check", str(config), "--fix", str(target)], capsys)
    assert_one_line_exit_2(code, out, err, "--fix output")


def test_fix_output_in_a_folder_nobody_may_write(tmp_path: Path, capsys) -> None:
    config = tmp_path / "ds.json"
    config.write_text(OK)
    if os.geteuid() == 0:  # root writes anywhere a mode allows; /sys refuses even root
        target = Path("/sys/autotune-check-test.json")
        if not Path("/sys").is_dir():
            pytest.skip("no /sys to refuse root a write")
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        target = locked / "out.json"
    code, out, err = run(["check", str(config), "--fix", str(target)], capsys)
    assert_one_line_exit_2(code, out, err, str(target.parent) if os.geteuid() else "--fix output /sys/")
    assert not target.exists()


def test_contradicting_flags(tmp_path: Path, capsys) -> None:
    config = tmp_path / "ds.json"
    config.write_text(OK)
    assert_one_line_exit_2(*run(["check", str(config), "--consumer", "bogus"], capsys), "--consumer must be")
    assert_one_line_exit_2(*run(["check", str(config), "--hf", "--consumer", "deepspeed"], capsys), "contradicts")
