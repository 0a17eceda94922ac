"""The CLI as a user meets it: real entry point, one-line errors, exit codes."""

import ast
import json
from pathlib import Path

import pytest
from tests.conftest import run_cli

import autotune.cli


def _one_line_error(done) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_probe_without_gpu_says_so_and_exits_zero() -> None:
    done = run_cli("probe")
    assert done.returncode == 0, done.stderr
    assert "No GPU visible" in done.stdout and "RAM available" in done.stdout
    data = json.loads(run_cli("probe", "--json").stdout)
    assert data["gpu_count"] == 0 and data["host"]["ram_total_bytes"] > 0


def test_model_summary_table_and_json(tmp_path) -> None:
    done = run_cli("model", "t5-3b")
    assert done.returncode == 0 and "2,851,598,336" in done.stdout and "encoder-decoder" in done.stdout
    data = json.loads(run_cli("model", "llama-2-7b", "--json").stdout)
    assert data["total_params"] == 6_738_415_616 and data["num_kv_heads"] == 32
    config = {"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2, "vocab_size": 100, "n_positions": 64}
    (tmp_path / "config.json").write_text(json.dumps(config))
    local = json.loads(run_cli("model", str(tmp_path), "--json").stdout)
    assert local["origin"] == "local" and local["vocab_size"] == 100
    assert "t5-11b" in run_cli("model", "--list").stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("model", "t5-3bb"), "did you mean"),
        (("model", "--no-such-flag"), "No such option"),
        (("probe", "--nvme-path", "/definitely/not/here"), "not a directory"),
        (("--model", "gpt2", "--gpus", "0", "--gpu-type", "a100-80gb"), "--gpus must be positive"),
        (("--model", "gpt2", "--gpus", "-2", "--gpu-type", "a100-80gb"), "--gpus must be positive"),
        (("--model", "gpt2", "--gpus", "8", "--gpu-type", "b300-ultra"), "unknown GPU type"),
        (("--model", "gpt2", "--gpus", "abc"), "Invalid value for '--gpus'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, fragment) -> None:
    assert fragment in _one_line_error(run_cli(*args))


def test_malformed_config_json(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{oops")
    assert "malformed config.json" in _one_line_error(run_cli("model", str(tmp_path)))
    (tmp_path / "config.json").write_text('{"model_type": "made-up"}')
    assert "unsupported model_type" in _one_line_error(run_cli("model", str(tmp_path)))


def test_nvme_path_not_writable() -> None:
    """/proc refuses new files even to root, like a read-only mount."""
    assert "not writable" in _one_line_error(run_cli("probe", "--nvme-path", "/proc"))


def test_debug_variable_adds_the_traceback_before_the_same_one_line() -> None:
    from autotune.cli import debug_wanted

    plain = run_cli("model", "t5-3bb")
    debug = run_cli("model", "t5-3bb", env={"AUTOTUNE_DEBUG": "1"})
    assert debug.returncode == plain.returncode == 2
    assert "Traceback" not in plain.stderr
    assert "Traceback (most recent call last)" in debug.stderr and "UserError" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1] == plain.stderr.strip()  # the one line is unchanged, and last
    wanted = {value: debug_wanted({"AUTOTUNE_DEBUG": value}) for value in ("1", "yes", "0", "", " ")}
    assert wanted == {"1": True, "yes": True, "0": False, "": False, " ": False}
    assert not debug_wanted({})


def test_cli_commands_take_shared_option_defaults_from_the_request_not_literals() -> None:
    """cli/options.py's shared options default to `D.<field>` (TuneRequest's own default) in every command: a
    literal there would restate a default that request/tune_request.py owns, and drift from it when it changes."""
    cli = Path(autotune.cli.__file__).parent
    options = ast.parse((cli / "options.py").read_text())
    shared = {target.id for node in options.body if isinstance(node, ast.Assign) for target in node.targets
              if isinstance(target, ast.Name) and target.id.endswith("Opt")}  # fmt: skip
    restated = []
    for path in sorted(cli.glob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef):
                continue
            arguments = function.args.args + function.args.kwonlyargs
            defaults = [None] * (len(function.args.args) - len(function.args.defaults)) + function.args.defaults
            for argument, default in zip(arguments, defaults + function.args.kw_defaults, strict=True):
                named = isinstance(argument.annotation, ast.Name) and argument.annotation.id in shared
                literal = isinstance(default, ast.Constant) and default.value not in (None, False)
                if named and literal:
                    restated.append(f"{path.name}:{argument.lineno} {argument.arg} = {default.value!r}")
    assert len(shared) > 10 and not restated, restated
