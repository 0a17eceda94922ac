"""`autotune check` and `plan --config` on hostile, huge configs: wall time and peak RSS of the CLI process.

    python benchmarks/check_bounds.py [--out benchmarks/results/check_bounds.json]

The target (a shared-machine session's finding): a 14 MB config with 700k keys made `check` run past 300 s and
1.6 GB; it must answer or refuse within 30 s and 512 MiB. Each case runs as a new CLI process, as a user runs
it; peak RSS is that child's own ru_maxrss (os.wait4).
Cases: the flat 700k-key file as strict JSON (C parser) and with one `//` comment (hjson's path), 700k keys
inside zero_optimization, and a 5000-digit integer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 30.0
TARGET_RSS_BYTES = 512 << 20
KEYS = 700_000


def _files(directory: Path) -> dict[str, Path]:
    flat = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}
    flat.update({f"key_{i:07d}": i for i in range(KEYS)})
    nested = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}
    nested["zero_optimization"].update({f"k_{i:07d}": i for i in range(KEYS)})
    texts = {
        "flat_700k_keys.json": json.dumps(flat),
        "flat_700k_keys_hjson.json": "// a comment: not strict JSON\n" + json.dumps(flat),
        "zero_section_700k_keys.json": json.dumps(nested),
        "int_5000_digits.json": '{"train_micro_batch_size_per_gpu": 1%s}' % ("0" * 5000),
    }
    paths = {}
    for name, text in texts.items():
        paths[name] = directory / name
        paths[name].write_text(text)
    return paths


def _run(args: list[str]) -> dict:
    """One CLI process; its own peak RSS from wait4's rusage (not the running maximum over all children)."""
    with tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-m", "autotune", *args], stdout=subprocess.DEVNULL, stderr=err,
            env={**os.environ, "DS_ACCELERATOR": "cpu"},
        )  # fmt: skip
        _, status, usage = os.wait4(child.pid, 0)
        elapsed = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    lines = stderr.strip().splitlines()
    return {
        "command": args[0],
        "exit_code": child.returncode,
        "wall_s": round(elapsed, 2),
        "peak_rss_bytes": usage.ru_maxrss * 1024,  # Linux reports KiB
        "said": lines[-1][:300] if lines else "",
        "traceback": "Traceback" in stderr,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "check_bounds.json"))
    parser.add_argument("--write-files", help=argparse.SUPPRESS)  # internal: make the inputs in a child process
    args = parser.parse_args()
    if args.write_files:
        _files(Path(args.write_files))
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from compare.environment import git_revision, load_average, now_utc, versions

    rows = []
    with tempfile.TemporaryDirectory(prefix="autotune-check-bounds-") as directory:
        # made in a child: Linux keeps ru_maxrss across fork+exec, so a parent that built 700k-key dicts would
        # lend every CLI child its own high-water mark
        subprocess.run([sys.executable, __file__, "--write-files", directory], check=True)
        for path in sorted(Path(directory).iterdir()):
            name, size = path.name, path.stat().st_size
            plan = ["plan", "--model", "gpt2", "--gpu-type", "t4", "--config", str(path)]
            for command in (["check", str(path)], plan):
                load = load_average()
                row = {"file": name, "bytes": size, **_run(command), "load_before": load}
                row["within_target"] = row["wall_s"] <= TARGET_S and row["peak_rss_bytes"] <= TARGET_RSS_BYTES
                rows.append(row)
                print(json.dumps(row), flush=True)
    from autotune.infra.atomic import atomic_write_json
    from portable_paths import portable

    atomic_write_json(
        args.out,
        portable(
            {
                "target": {"wall_s": TARGET_S, "peak_rss_bytes": TARGET_RSS_BYTES},
                "rows": rows,
                "environment": {
                    "date": now_utc(),
                    "versions": versions(),
                    "git": git_revision(Path(__file__).parents[1]),
                },
            }
        ),
    )


if __name__ == "__main__":
    main()
