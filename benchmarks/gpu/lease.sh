#!/usr/bin/env bash
# One command, one lease: everything a lent GPU machine should show in one call that ends by itself within its
# budget (default 510 s = 8.5 min) and leaves each finished item in $OUT at once (see benchmarks/gpu/README.md).
#
#   bash benchmarks/gpu/lease.sh [--dry-run] [--budget-s 510] [--plant-fault KEY]
#
# Most valuable first, each stage under its own `timeout`:
#   install (carried .whl/) -> both DeepSpeed ops built in parallel (TORCH_CUDA_ARCH_LIST for this card) while the
#   preflight runs (versions, env, CUDA headers, `autotune probe --json`, pinned-memory probe) -> memory points
#   (ZeRO 0-3, offload, checkpointing) -> two of them again in one warm worker pool -> OOM probes -> a quick tune on an emulated 24 GB card and its choice
#   re-run with its mode -> the built ops packed for the next lease.
# $OUT holds at most these files (the device tool brings back 8): lease.log (this output), lease.json (stages,
# preflight, ops), validation.json (the kit's rows), trial-logs.txt (failed and cut-off trials' log tails),
# gpu-ops.tgz (built ops, debug info stripped). --dry-run: the CPU backend and tiny models (tests/test_gpu_lease.py).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
dry=0
budget=${LEASE_BUDGET_S:-510}
plant=()
while [ $# -gt 0 ]; do
    case $1 in
        --dry-run) dry=1 ;;
        --budget-s) budget=${2:?}; shift ;;
        --plant-fault) plant=(--plant-fault "${2:?}"); shift ;;
        *) echo "lease.sh: unknown argument $1 (see the header of benchmarks/gpu/lease.sh)" >&2; exit 2 ;;
    esac
    shift
done
case $budget in ''|*[!0-9]*) echo "lease.sh: --budget-s takes whole seconds, not '$budget'" >&2; exit 2 ;; esac
OUT=${OUT:-$REPO/autotune-out/lease}
mkdir -p "$OUT"
SCRATCH=${LEASE_SCRATCH:-$(mktemp -d /tmp/autotune-lease.XXXXXX)}
mkdir -p "$SCRATCH"
start=$(date +%s)
exec > >(tee -a "$OUT/lease.log") 2>&1
export PYTHONUNBUFFERED=1
device=cuda; [ "$dry" = 1 ] && device=cpu
elapsed() { echo $(( $(date +%s) - start )); }
say() { echo "[lease +$(elapsed)s] $*"; }
PREFLIGHT=(python3 benchmarks/gpu/preflight.py --out "$OUT/lease.json")
record() { "${PREFLIGHT[@]}" "$@"; }

# run_stage NAME END_BY_S CMD...: runs CMD under `timeout`, ending by END_BY_S seconds after the start;
# LIMIT (seconds it may take) is exported for CMD's own budget. Skipped when under 10 s are left.
run_stage() {
    local name=$1 end_by=$2
    shift 2
    LIMIT=$(( end_by - $(elapsed) ))
    if [ "$LIMIT" -lt 10 ]; then
        say "skip $name: ${LIMIT}s left before its end at ${end_by}s"
        record stage "$name" 125 0 "$LIMIT"
        return 125
    fi
    say "stage $name (at most ${LIMIT}s)"
    local t0 rc ms
    t0=$(date +%s%N)
    timeout -k 5 "$LIMIT" "$@"
    rc=$?
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    record stage "$name" "$rc" "$((ms / 1000)).$(printf %03d $((ms % 1000)))" "$LIMIT"
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && cut_off_logs "$name"
    say "stage $name: exit $rc"
    return "$rc"
}

# The trial in flight when a stage ran out of time: its logs' tails, so the cut-off is explained.
cut_off_logs() {
    local last
    last=$(ls -td "$SCRATCH"/trials/*/ 2>/dev/null | head -1)
    [ -n "$last" ] || return 0
    {
        echo "===== $(basename "$last"): in flight when stage $1 ran out of time"
        find "$last" -name '*.log' | while read -r f; do echo "----- $f"; tail -n 120 "$f"; done
    } >> "$OUT/trial-logs.txt"
}

# ---------------------------------------------------------------- install
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"  # the project is not pip-installed there
if [ "$dry" = 0 ] && [ -d .whl ]; then
    run_stage install 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SCRATCH/site" .whl/*.whl
    export PYTHONPATH="$SCRATCH/site:$PYTHONPATH" PATH="$SCRATCH/site/bin:$PATH"  # bin: the deepspeed runner
fi
if [ "$dry" = 0 ]; then
    export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$REPO/.gpu-cache/torch_extensions}
    mkdir -p "$TORCH_EXTENSIONS_DIR"
    if [ -f .gpu-cache/gpu-ops.tgz ]; then  # ops an earlier lease built: newer than the sources, so ninja keeps them
        tar xzf .gpu-cache/gpu-ops.tgz -C "$TORCH_EXTENSIONS_DIR" && find "$TORCH_EXTENSIONS_DIR" -type f -exec touch {} +
    fi
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-${cap:-9.0}}  # this card only: one arch, not DeepSpeed's list
    missing=$(python3 benchmarks/gpu/preflight.py cpath 2>/dev/null)  # headers the toolkit lacks, from pip's nvidia-*
    [ -n "$missing" ] && export CPATH="$missing${CPATH:+:$CPATH}"
fi
say "device $device, budget ${budget}s, out $OUT, extensions ${TORCH_EXTENSIONS_DIR:-default}, archs ${TORCH_CUDA_ARCH_LIST:-}"

# ---------------------------------------------------------------- ops (background) + preflight
# No build runs at the start of this command: any lock is a leftover of a machine taken away mid-build
# (torch's FileBaton would wait on it forever). trial/ops.py finds them where torch puts them.
python3 -c "from autotune.trial.ops import build_locks
for lock in build_locks('$device'): lock.unlink(missing_ok=True); print('removed leftover build lock', lock)"
builders=$(python3 -c "from autotune.trial.ops import TRIAL_OPS; print(*TRIAL_OPS['$device'])")
ops_end=$(( budget * 45 / 100 ))
njobs=$(( $(nproc) / $(echo "$builders" | wc -w) ))
pids=()
for builder in $builders; do
    MAX_JOBS=$(( njobs > 0 ? njobs : 1 )) timeout -k 5 $(( ops_end - $(elapsed) )) \
        python3 benchmarks/gpu/preflight.py --device "$device" --out "$SCRATCH/op-$builder.json" op "$builder" \
        > "$SCRATCH/op-$builder.log" 2>&1 &
    pids+=($!)
done
run_stage versions 60 "${PREFLIGHT[@]}" versions
run_stage headers 80 "${PREFLIGHT[@]}" headers
run_stage probe 120 "${PREFLIGHT[@]}" probe
[ "$dry" = 0 ] && run_stage pinned 150 "${PREFLIGHT[@]}" pinned
for pid in "${pids[@]}"; do wait "$pid"; done
for builder in $builders; do  # a build cut off leaves its output's tail and its lock: say the one, remove the other
    [ -f "$SCRATCH/op-$builder.json" ] || tail -c 1500 "$SCRATCH/op-$builder.log" \
        | python3 -c "import json,sys; json.dump({'builder': '$builder', 'error': 'cut off or failed: ' + sys.stdin.read()}, open('$SCRATCH/op-$builder.json', 'w'))"
done
python3 -c "from autotune.trial.ops import build_locks
for lock in build_locks('$device'): lock.unlink(missing_ok=True); print('removed the lock of a build cut off', lock)"
record merge ops "$SCRATCH"/op-*.json
say "ops: $(python3 -c "import json; print(json.load(open('$OUT/lease.json'))['ops'])")"

# ---------------------------------------------------------------- the kit: memory, OOM, tune
kit_args=(--lease --results "$OUT/validation.json" --out "$SCRATCH/kit" --trials-dir "$SCRATCH/trials" "${plant[@]}")
[ "$dry" = 1 ] && kit_args+=(--dry-run)
kit() {  # kit STAGE END_BY_S: the kit's budget stops it starting an item it could not finish
    run_stage "$1" "$2" bash -c 'python3 benchmarks/gpu/kit.py "$@" --budget-s $(( LIMIT - 10 ))' _ \
        "${kit_args[@]}" --stages "$1"
}
export LIMIT
kit memory $(( budget * 58 / 100 ))
kit warm $(( budget * 66 / 100 ))  # two memory points again in one warm pool: may GPU trials run warm?
kit oom $(( budget * 75 / 100 ))
kit tune $(( budget - 12 ))

# ---------------------------------------------------------------- built ops for the next lease
if [ "$dry" = 0 ]; then
    run_stage pack-ops "$budget" bash -c '
        cp -a "$TORCH_EXTENSIONS_DIR" "$0/ops" && find "$0/ops" \( -name "*.so" -o -name "*.o" \) -exec strip --strip-debug {} + 2>/dev/null
        rm -f "$0"/ops/*/lock; tar czf "$0/gpu-ops.tgz" -C "$0/ops" . && size=$(stat -c %s "$0/gpu-ops.tgz")
        [ "$size" -lt $((15 * 1024 * 1024)) ] && mv "$0/gpu-ops.tgz" "$OUT/" || echo "gpu-ops.tgz: $size bytes, over the 16 MiB a file may have"' \
        "$SCRATCH"
fi
[ -n "${LEASE_SCRATCH:-}" ] || rm -rf "$SCRATCH"
say "done in $(elapsed)s of ${budget}s"
