#!/usr/bin/env bash
# The GPU validation kit's one entry point (see benchmarks/gpu/README.md).
#   bash benchmarks/gpu/validate.sh [--dry-run] [--stages setup,memory,oom,tune,grid] [--budget-s 540] [--out DIR]
# On a GPU machine without package access, wheels from benchmarks/gpu/make-wheels.sh travel in .whl/ and are
# installed to a private target first; the repo's src/ goes on PYTHONPATH (the project is not pip-installed there,
# its torch lower bound would not resolve). Built DeepSpeed ops are kept in .gpu-cache/ so a later machine that is
# handed that folder skips the build. Everything after setup is in kit.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
dry=0
for arg in "$@"; do [ "$arg" = "--dry-run" ] && dry=1; done
if [ "$dry" = 0 ] && [ -d .whl ]; then
    site=${AUTOTUNE_KIT_SITE:-/tmp/autotune-kit-site}
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
        || { echo "validate.sh: installing the carried wheels failed" >&2; exit 2; }
    export PYTHONPATH="$site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH"  # bin: the deepspeed runner
else
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
if [ "$dry" = 0 ]; then
    export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.gpu-cache/torch_extensions}
    mkdir -p "$TORCH_EXTENSIONS_DIR"
    # Ops built on an earlier machine: newer than the freshly unpacked sources, so ninja keeps them.
    find "$TORCH_EXTENSIONS_DIR" -type f -exec touch {} + 2>/dev/null
    # A lock left by a machine taken away mid-build, where torch puts it (trial/launch/ops.py build_locks: directly
    # under TORCH_EXTENSIONS_DIR when it is set, under a py*_cu* folder of the default cache otherwise).
    python3 -c "from autotune.trial.launch.ops import build_locks
for lock in build_locks('cuda'): lock.unlink(missing_ok=True)"
fi
results=()
if [ "$dry" = 0 ] && [ -n "${OUT:-}" ]; then
    # Straight into the device tool's $OUT, item by item, so a command cut off keeps what it finished.
    cp benchmarks/results/gpu/validation.json "$OUT"/ 2>/dev/null
    results=(--results "$OUT/validation.json")
fi
python3 benchmarks/gpu/kit.py "$@" "${results[@]}"
status=$?
if [ "$dry" = 0 ] && [ -n "${OUT:-}" ]; then
    tar czf "$OUT/gpu-cache.tgz" .gpu-cache 2>/dev/null  # built ops for the next call
fi
exit $status
