"""`--json` output is JSON and nothing else, whatever DeepSpeed logs while it is imported.

DeepSpeed's logger writes to the stdout it saw at import (deepspeed 0.19.8 utils/logging.py:45, 0.15.4 :69); 0.15.4
creates it at INFO (:82) and logs "Setting ds_accelerator to cpu (override)" at import (real_accelerator.py:219), so
`check --json` on 0.15.4 printed that line before the JSON (seen on 0.15.4 before DeepSpeed was imported off stdout).
Here the installed DeepSpeed's logger is made INFO-level at creation, as 0.15.4's is, and the command runs in a
fresh process (DeepSpeed not yet imported).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO

# Run autotune's CLI with DeepSpeed's logger and its handler at INFO from their creation (0.15.4's level).
_AS_OLD_DEEPSPEED = """
import logging, sys
_logger_level, _handler_level = logging.Logger.setLevel, logging.Handler.setLevel
logging.Logger.setLevel = lambda self, level: _logger_level(self, logging.INFO if self.name == "DeepSpeed" else level)
logging.StreamHandler.setLevel = lambda self, level: _handler_level(self, min(logging._checkLevel(level), logging.INFO))
sys.argv = ["autotune", *sys.argv[1:]]
from autotune.cli import main
main()
"""


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "DS_ACCELERATOR"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", _AS_OLD_DEEPSPEED, *argv], capture_output=True, text=True, env=env, cwd=REPO,
        timeout=600,
    )  # fmt: skip


def test_check_json_stdout_is_json_when_deepspeed_logs_at_import() -> None:
    done = _run("check", "tests/data/check/clean.json", "--gpus", "8", "--json")
    assert done.returncode in (0, 1), done.stderr[-2000:]
    report = json.loads(done.stdout)  # nothing before or after the JSON
    assert "findings" in report or report  # a report, not an empty document
    assert "Setting ds_accelerator" not in done.stdout + done.stderr  # the import-time line is dropped
