#!/usr/bin/env bash
# Builds .whl/ (git-ignored): the pinned wheel set of benchmarks/gpu/wheels.txt for the lent GPU machine
# (Python 3.12, x86-64 manylinux, no package registry there), then checks it (benchmarks/gpu/check_wheels.py):
# every wheel's requirements met by the set or the image at the versions carried, `pip install --no-index
# --no-deps --target` with Python 3.12, and the set imported at its floor versions.
# Run from anywhere in the repo, on a machine with registry access and torch importable (deepspeed's sdist
# builds against it). PY312=/path/to/python3.12 picks the interpreter for the 3.12 checks.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> "$(git rev-parse --git-path info/exclude)"
python3 -c 'import torch' 2>/dev/null || { echo "make-wheels: torch must be importable here to build the deepspeed wheel" >&2; exit 2; }
rm -rf .whl && mkdir -p .whl
pins=$(sed -e 's/#.*//' -e '/^\s*$/d' benchmarks/gpu/wheels.txt | tr -d ' ')
ds=$(echo "$pins" | grep '^deepspeed==')
# deepspeed ships as an sdist; with its ops left to JIT it builds into a pure-python wheel.
DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps --no-build-isolation "$ds" -w .whl
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# shellcheck disable=SC2046
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
    -d .whl $(echo "$pins" | grep -v '^deepspeed==')
ls -1 .whl
du -sh .whl
python3 benchmarks/gpu/check_wheels.py .whl
