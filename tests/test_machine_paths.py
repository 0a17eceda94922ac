"""No committed text file names a path of the machine it was made on, nor a document outside the repository.

A home or root directory, a user's checkout, or a temporary directory that a run created says nothing on another
machine and leaks the layout of the one that wrote it: results record paths relative to the repository
(`benchmarks/portable_paths.py` rewrites them before a benchmark writes its JSON).

False positives left alone, on purpose: `/tmp` in scripts and tests, where it is a runtime default
(`mktemp -d /tmp/...`, a node-local copy in an sbatch example, a config value under test); example paths such as
`/shared/autotune`; system paths (`/proc/cpuinfo`, `/usr/bin/time`, `/dev/shm`).
"""

from __future__ import annotations

import re
import subprocess

import pytest
from tests.conftest import REPO

# A home, the root user's home or a macOS user's: never in a committed file.
_HOME = re.compile(r"(?<![\w.~-])/(?:root|home/[a-z_][\w-]*|Users/[A-Za-z][\w-]*)/")
# This project's machines keep checkouts and their tools under one top directory (two words so that this file
# does not match itself).
_CHECKOUT = re.compile("(?<![\\w.-])/" + "work" + r"/")
# A temporary directory: allowed as a default in code, not in what a run wrote down (results, records, docs).
_TEMP = re.compile(r"(?<![\w.-])/(?:tmp|var/folders)/[\w.-]+")
_RECORDED = ("benchmarks/results/", "benchmarks/records/", "docs/", "README.md", "benchmarks/README.md")

_BINARY = (".png", ".jpg", ".gz", ".whl", ".sqlite", ".pdf")


def _committed_text_files() -> list[str]:
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the committed files are not known")
    return [name for name in listed.splitlines() if not name.endswith(_BINARY) and (REPO / name).is_file()]


def machine_paths(name: str, text: str) -> list[str]:
    """Each offending path in `text` of the committed file `name`, with its line number."""
    patterns = [_HOME, _CHECKOUT]
    if name.startswith(_RECORDED):
        patterns.append(_TEMP)
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for pattern in patterns:
            found += [f"{name}:{number}: {match.group(0)}" for match in pattern.finditer(line)]
    return found


def test_the_patterns_catch_machine_paths_and_spare_the_rest() -> None:
    assert machine_paths("benchmarks/results/x.json", '"cmd": "/tmp/autotune-bench-f6koac_g/ds_config.json"')
    assert machine_paths("tests/x.py", "# see /home/alice/notes.md")
    assert machine_paths("src/x.py", "python = '/root/.pyenv/versions/3.11.7/bin/python3'")
    assert machine_paths("docs/x.md", "/" + "work/wt/docs/src")
    assert not machine_paths("benchmarks/gpu/lease.sh", "SCRATCH=$(mktemp -d /tmp/autotune-lease.XXXXXX)")
    assert not machine_paths("README.md", "--cache-dir /shared/autotune --out ~/run/ds_config.json")
    assert not machine_paths("docs/x.md", "no `avx512_bf16` flag in /proc/cpuinfo; <tmp>/torch_extensions")


def test_no_committed_file_holds_a_machine_path() -> None:
    offending = []
    for name in _committed_text_files():
        if name == "tests/test_machine_paths.py":
            continue
        try:
            text = (REPO / name).read_text()
        except UnicodeDecodeError:
            continue
        offending += machine_paths(name, text)
    assert not offending, "\n".join(offending[:40])


def test_results_are_written_portable(monkeypatch: pytest.MonkeyPatch) -> None:
    """What benchmarks write passes through portable(): the repository relative, a temp dir `<tmp>`, no interpreter."""
    import sys
    import tempfile

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from portable_paths import portable

    temp = tempfile.gettempdir()
    data = {
        "command": [f"{sys.executable}", f"{REPO}/tests/scripts/user_jobs/plain_deepspeed.py", "--seq-len", "64"],
        "said": f"error: {temp}/autotune-check-bounds-qgfqdhx8/flat.json has 700,003 keys",
        "runs": 3,
    }
    fixed = portable(data)
    assert fixed["command"] == ["python3", "tests/scripts/user_jobs/plain_deepspeed.py", "--seq-len", "64"]
    assert fixed["said"] == "error: <tmp>/flat.json has 700,003 keys" and fixed["runs"] == 3
    assert not machine_paths("benchmarks/results/x.json", str(fixed))
