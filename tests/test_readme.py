"""The README's commands run as printed: every option it shows exists on its command (fast, from the CLI's own
parser), and the CPU commands that need no trial run in a scratch directory, in the README's order (slow).

The quick start is not run here: it is minutes of real trials, and `benchmarks/quick_start.py` runs it word for
word from a fresh clone (test_benchmarks_smoke checks that it reads the README's line). Commands that name a file
the reader brings (`my.json`, `my_ds_config.json`) and those that need GPUs, SLURM or other hosts are held to
`--help` only.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import REPO

README = REPO / "README.md"
# Starts of an autotune command inside a shell line: line start, `$(`, or after srun's own options.
_AUTOTUNE = re.compile(r"(?:^|[\s(])autotune\s+(?P<rest>[^|;)]*)")
_PLACEHOLDER_FILES = ("my.json", "my_ds_config.json")


def bash_lines(readme: Path) -> list[str]:
    """The logical lines of the README's ```bash blocks (backslash continuations joined)."""
    text = readme.read_text()
    lines: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                lines.append(line)
    return lines


def autotune_commands(readme: Path) -> list[list[str]]:
    """Each `autotune ...` command in the README's shell blocks, as argv after `autotune`."""
    commands = []
    for line in bash_lines(readme):
        for match in _AUTOTUNE.finditer(line):
            rest = match.group("rest").split("&&")[0]
            commands.append(shlex.split(rest, comments=True))
    return commands


def _subcommand(argv: list[str]) -> tuple[str, list[str]]:
    if argv and not argv[0].startswith("-"):
        return argv[0], argv[1:]
    return "tune", argv  # `autotune --model ...` is `autotune tune --model ...`


def _option_names() -> dict[str, set[str]]:
    """Every option string per subcommand, from the click command typer builds (what `--help` prints)."""
    from typer.main import get_command

    from autotune.cli import _register_commands, app

    _register_commands(None)
    group = get_command(app)
    names: dict[str, set[str]] = {}
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        names[name] = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    return names


def test_the_readme_shows_each_job_with_its_command() -> None:
    commands = autotune_commands(README)
    used = {_subcommand(argv)[0] for argv in commands}
    assert {"tune", "plan", "hook", "check"} <= used
    hooks = [argv for argv in commands if argv[0] == "hook"]
    # the SLURM recipe (every task's hook, then the batch host's --print-env) and the torchrun recipe
    assert len(hooks) == 3 and sum("--print-env" in argv for argv in hooks) == 2


def test_every_option_the_readme_shows_exists_on_its_command() -> None:
    names = _option_names()
    unknown = []
    for argv in autotune_commands(README):
        command, args = _subcommand(argv)
        assert command in names, f"README runs `autotune {command}`, which does not exist"
        for arg in args:
            if arg == "--":
                break
            if arg.startswith("-") and arg.split("=")[0] not in names[command]:
                unknown.append(f"autotune {command} {arg}")
    assert not unknown, f"options the CLI does not have: {unknown}"


def test_the_hook_recipe_names_the_agreed_variables() -> None:
    """The variables `hook --print-env` exports, as the training commands of the recipe use them."""
    text = README.read_text()
    for variable in ("AUTOTUNE_DS_CONFIG", "AUTOTUNE_HF_CONFIG", "AUTOTUNE_HF_ARGS", "AUTOTUNE_WORLD_SIZE"):
        assert f"`{variable}`" in text
    shell = "\n".join(bash_lines(README))
    assert '--deepspeed "$AUTOTUNE_HF_CONFIG" $AUTOTUNE_HF_ARGS' in shell  # an HF Trainer script
    assert '--deepspeed --deepspeed_config "$AUTOTUNE_DS_CONFIG"' in shell  # a plain DeepSpeed script


def test_the_file_table_names_every_file_a_tune_writes() -> None:
    text = README.read_text()
    table = text[text.index("## Which file goes to which launcher") :]
    for name in ("ds_config.json", "ds_config.hf.json", "ds_config.accelerate.yaml", "ds_config.autotune.json"):
        assert f"`{name}`" in table
    assert "autotune-report.md" in table


def test_the_readme_stays_a_guide() -> None:
    """Issue 45: at most ~200 lines (done at <= 220); every docs/ page it links exists or is named by the plan."""
    text = README.read_text()
    assert len(text.splitlines()) <= 220
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", text))
    # docs/install.md, docs/tested-versions.md and docs/cluster.md are written by other branches of this change.
    missing = {page for page in linked if not (REPO / page).exists()}
    assert missing <= {"docs/install.md", "docs/tested-versions.md", "docs/cluster.md"}


def _runs_here(argv: list[str], cwd: Path) -> bool:
    """A CPU command that launches no trial, and whose input files exist (made by an earlier README command)."""
    command, args = _subcommand(argv)
    if any(arg in _PLACEHOLDER_FILES for arg in args) or any("$" in arg for arg in args):
        return False
    if command == "tune":
        return "--gpu-type" in args or "--gpu-memory" in args  # plan-only
    if command == "check":
        return all((cwd / arg).exists() for arg in args if arg.endswith(".json") and not arg.startswith("-"))
    return command in ("plan", "model", "probe")


@pytest.mark.slow  # plan, plan-only tune and check: ~1-2 min on 2 cores under load
def test_the_readmes_cpu_commands_run_as_printed(tmp_path: Path) -> None:
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "200"}
    ran, held_to_help = [], []
    for argv in autotune_commands(README):
        if not _runs_here(argv, tmp_path):
            held_to_help.append(argv)
            continue
        done = subprocess.run(
            [sys.executable, "-m", "autotune", *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, f"autotune {shlex.join(argv)}: exit {done.returncode}\n{done.stderr[-2000:]}"
        ran.append(argv)
    assert {_subcommand(argv)[0] for argv in ran} >= {"plan", "tune", "check"}
    # What is not run: the quick start (real trials), the GPU-node tune, the hook recipes, the placeholder files.
    not_run = {shlex.join(argv) for argv in held_to_help}
    assert all(
        "--device cpu" in cmd or "hook" in cmd or any(name in cmd for name in _PLACEHOLDER_FILES) or "llama-3-8b" in cmd
        for cmd in not_run
    ), not_run
