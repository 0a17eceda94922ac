#!/usr/bin/env bash
# Wheels the GPU machine lacks: ../shared/gpu/make-wheels (deepspeed, hjson, pydantic, ...) plus the
# transformers version this project is tested with (the GPU image's may be older). Run from the repo root
# on a machine with registry access and torch importable; writes .whl/ (about 19 MB, git-ignored).
set -euo pipefail
cd "$(dirname "$0")/../.."
shared=${SHARED_DIR:-../shared}
"$shared/gpu/make-wheels"
want=$(python3 -c "import re,tomllib;d=tomllib.load(open('pyproject.toml','rb'))['project']['dependencies'];print([re.split('>=',x)[1] for x in d if x.startswith('transformers')][0])")
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl "transformers==$want"
ls -1 .whl
du -sh .whl
