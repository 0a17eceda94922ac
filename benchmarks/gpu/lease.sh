#!/usr/bin/env bash
# One command, one lease: what the GPU default rests on, in one call that ends by itself within its budget
# (default 510 s = 8.5 min) and streams everything into $OUT as it happens (see benchmarks/gpu/README.md).
#
#   bash benchmarks/gpu/lease.sh [--dry-run [--emulate-h200]] [--budget-s 510] [--plant-fault KEY]
#
# Ordered by what the GPU default needs (issue 42): install -> smoke (one CUDA trial needing no DeepSpeed op, and
# `python -m autotune --help`; stop early if either fails) beside the op builds and the preflight -> warm vs fresh
# (two points fresh with torch's AdamW, so still beside the builds; the sampler at 1 s; the same points in one warm
# pool) -> the tune on an emulated 24 GB card with its fresh confirmation -> OOM classes -> the remaining memory
# points, cheapest first -> the built ops packed for the next lease.
# $OUT (the device tool brings back 8 files): lease.log (this output, as printed), lease.json (stages, preflight,
# ops), validation.json (the kit's rows), trial-logs.txt (failed trials' log tails), trial-stream.txt (every trial's
# and build's log, copied as written: a stage cut off still leaves its log), gpu-ops.tgz (built ops).
# --dry-run: the CPU backend and tiny models; --emulate-h200 adds sleeps so each item takes its estimated cold-H200
# wall (points.py H200_WALL_S; tests/test_gpu_lease.py).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
dry=0
emulate=0
budget=${LEASE_BUDGET_S:-510}
plant=()
while [ $# -gt 0 ]; do
    case $1 in
        --dry-run) dry=1 ;;
        --emulate-h200) emulate=1 ;;
        --budget-s) budget=${2:?}; shift ;;
        --plant-fault) plant=(--plant-fault "${2:?}"); shift ;;
        *) echo "lease.sh: unknown argument $1 (see the header of benchmarks/gpu/lease.sh)" >&2; exit 2 ;;
    esac
    shift
done
case $budget in ''|*[!0-9]*) echo "lease.sh: --budget-s takes whole seconds, not '$budget'" >&2; exit 2 ;; esac
[ "$emulate" = 1 ] && [ "$dry" = 0 ] && { echo "lease.sh: --emulate-h200 is for --dry-run only" >&2; exit 2; }
OUT=${OUT:-$REPO/autotune-out/lease}
mkdir -p "$OUT"
SCRATCH=${LEASE_SCRATCH:-$(mktemp -d /tmp/autotune-lease.XXXXXX)}
mkdir -p "$SCRATCH/tmp"
export TMPDIR=$SCRATCH/tmp  # the tune's warm pool and fresh trials keep their logs here while they run: followed
# Wheels and built ops at fixed paths: DeepSpeed compiles from absolute paths, so ops carried from one lease are
# reused by the next only where the sources sit where they sat (a mktemp path would rebuild them every time).
FIXED=${LEASE_FIXED_DIR:-/tmp/autotune-lease-fixed}
start=$(date +%s)
exec > >(tee -a "$OUT/lease.log") 2>&1
export PYTHONUNBUFFERED=1
device=cuda; [ "$dry" = 1 ] && device=cpu
elapsed() { echo $(( $(date +%s) - start )); }
say() { echo "[lease +$(elapsed)s] $*"; }
emul() { [ "$emulate" = 1 ] && sleep "$1"; return 0; }  # dry run: the cold-H200 time of a step the CPU skips
PREFLIGHT=(python3 benchmarks/gpu/preflight.py --out "$OUT/lease.json")
record() { "${PREFLIGHT[@]}" "$@"; }

# Every log under SCRATCH (trials, pools, op builds) copied into $OUT as it grows, until the lease ends.
python3 benchmarks/gpu/follow_logs.py --watch "$SCRATCH" --out "$OUT/trial-stream.txt" &
follower=$!
finish() { kill "$follower" 2>/dev/null; wait "$follower" 2>/dev/null; }
trap finish EXIT

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
    say "stage $name: exit $rc"
    return "$rc"
}

# ---------------------------------------------------------------- install
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"  # the project is not pip-installed there
if [ "$dry" = 0 ] && [ -d .whl ]; then
    run_stage install 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$FIXED/site" .whl/*.whl
    export PYTHONPATH="$FIXED/site:$PYTHONPATH" PATH="$FIXED/site/bin:$PATH"  # bin: the deepspeed runner
fi
[ "$dry" = 1 ] && run_stage install 60 sleep "$([ "$emulate" = 1 ] && echo 15 || echo 0)"
if [ "$dry" = 0 ]; then
    export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$FIXED/torch_extensions}
    mkdir -p "$TORCH_EXTENSIONS_DIR"
    stamp=$(python3 benchmarks/gpu/preflight.py cpu-stamp)
    if [ -f .gpu-cache/gpu-ops.tgz ]; then  # an earlier lease's ops: only for this CPU (cpu_adam is -march=native)
        mkdir -p "$SCRATCH/carried" && tar xzf .gpu-cache/gpu-ops.tgz -C "$SCRATCH/carried"
        if [ "$(cat "$SCRATCH/carried/cpu-stamp.txt" 2>/dev/null)" = "$stamp" ]; then
            rm -f "$SCRATCH/carried/cpu-stamp.txt" && cp -a "$SCRATCH/carried/." "$TORCH_EXTENSIONS_DIR/"
            find "$TORCH_EXTENSIONS_DIR" -type f -exec touch {} +  # newer than the sources: ninja keeps them
            say "carried ops reused (CPU: $stamp)"
        else
            say "carried ops not reused: built for '$(cat "$SCRATCH/carried/cpu-stamp.txt" 2>/dev/null)', here '$stamp'"
        fi
    fi
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-${cap:-9.0}}  # this card only: one arch, not DeepSpeed's list
    missing=$(python3 benchmarks/gpu/preflight.py cpath 2>/dev/null)  # headers the toolkit lacks, from pip's nvidia-*
    [ -n "$missing" ] && export CPATH="$missing${CPATH:+:$CPATH}"
    libs=$("${PREFLIGHT[@]}" cuda-libs "$FIXED/cuda-links" 2>/dev/null)  # -lcudart/-lcurand/-lcublas resolvable
    [ -n "$libs" ] && export LIBRARY_PATH="$libs${LIBRARY_PATH:+:$LIBRARY_PATH}"
fi
say "device $device, budget ${budget}s, out $OUT, extensions ${TORCH_EXTENSIONS_DIR:-default}, archs ${TORCH_CUDA_ARCH_LIST:-}"

# ---------------------------------------------------------------- ops (background) + smoke + preflight
# No build runs at the start of this command: any lock is a leftover of a machine taken away mid-build
# (torch's FileBaton would wait on it forever). trial/launch/ops.py finds them where torch puts them.
python3 -c "from autotune.trial.launch.ops import build_locks
for lock in build_locks('$device'): lock.unlink(missing_ok=True); print('removed leftover build lock', lock)"
builders=$(python3 -c "from autotune.trial.launch.ops import TRIAL_OPS; print(*TRIAL_OPS['$device'])")
ops_end=$(( budget * 45 / 100 ))
njobs=$(( $(nproc) / $(echo "$builders" | wc -w) ))
pids=()
for builder in $builders; do
    MAX_JOBS=$(( njobs > 0 ? njobs : 1 )) timeout -k 5 $(( ops_end - $(elapsed) )) bash -c \
        'python3 benchmarks/gpu/preflight.py --device "$1" --out "$2" op "$3" && sleep "$4"' _ \
        "$device" "$SCRATCH/op-$builder.json" "$builder" "$([ "$emulate" = 1 ] && echo 150 || echo 0)" \
        > "$SCRATCH/op-$builder.log" 2>&1 &
    pids+=($!)
done

kit_args=(--lease --results "$OUT/validation.json" --out "$SCRATCH/kit" --trials-dir "$SCRATCH/trials" "${plant[@]}")
[ "$dry" = 1 ] && kit_args+=(--dry-run)
[ "$emulate" = 1 ] && kit_args+=(--emulate-h200)
kit() {  # kit STAGE END_BY_S [ARGS...]: the kit's budget stops it starting an item it could not finish
    local stage=$1 end_by=$2
    shift 2
    run_stage "$stage" "$end_by" bash -c 'python3 benchmarks/gpu/kit.py "$@" --budget-s $(( LIMIT - 5 ))' _ \
        "${kit_args[@]}" --stages "$stage" "$@"
}
export LIMIT

# The smoke first: a CUDA trial through the real trial path that needs no op, and the CLI. Either failing ends the
# lease here, said, instead of every later stage failing the same way.
run_stage help $(( $(elapsed) + 40 )) bash -c 'python3 -m autotune --help > "$0"' "$SCRATCH/help.txt"
help_rc=$?
kit smoke $(( $(elapsed) + (dry ? 180 : 60) ))  # a loaded CPU imports torch and DeepSpeed far slower than a GPU host
smoke_rc=$?
if [ "$help_rc" != 0 ] || [ "$smoke_rc" != 0 ]; then
    say "stopping early: 'python -m autotune --help' exit $help_rc, smoke trial exit $smoke_rc (validation.json"
    say "smoke holds its row, trial-stream.txt its logs); the builds and the later stages would fail the same way"
    head -c 3000 "$SCRATCH/help.txt"
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
    python3 -c "from autotune.trial.launch.ops import build_locks
for lock in build_locks('$device'): lock.unlink(missing_ok=True); print('removed the lock of a build stopped', lock)"
    exit 1
fi
run_stage versions $(( $(elapsed) + 30 )) "${PREFLIGHT[@]}" versions

# Warm vs fresh, beside the builds (torch's AdamW loads no op): the two points fresh, ZeRO-3 at the 1 s sampler too,
# then both again in one warm pool, each warm item gated on its fresh twin's wall (x1.2). Windows from the cold-H200
# estimates (points.py H200_WALL_S): 2 x 25 s fresh, 25 s sampler, 3 x 30 s warm.
kit memory $(( $(elapsed) + 65 )) --memory-set warm
kit sampler $(( $(elapsed) + 35 ))
kit warm $(( $(elapsed) + 100 ))
run_stage headers $(( $(elapsed) + 30 )) "${PREFLIGHT[@]}" headers
run_stage probe $(( $(elapsed) + 30 )) "${PREFLIGHT[@]}" probe
[ "$dry" = 0 ] && run_stage pinned $(( $(elapsed) + 40 )) "${PREFLIGHT[@]}" pinned

for pid in "${pids[@]}"; do wait "$pid"; done
for builder in $builders; do  # a build cut off leaves its output's tail and its lock: say the one, remove the other
    [ -f "$SCRATCH/op-$builder.json" ] || tail -c 1500 "$SCRATCH/op-$builder.log" \
        | python3 -c "import json,sys; json.dump({'builder': '$builder', 'error': 'cut off or failed: ' + sys.stdin.read()}, open('$SCRATCH/op-$builder.json', 'w'))"
done
python3 -c "from autotune.trial.launch.ops import build_locks
for lock in build_locks('$device'): lock.unlink(missing_ok=True); print('removed the lock of a build cut off', lock)"
record merge ops "$SCRATCH"/op-*.json
say "ops: $(python3 -c "import json; print(json.load(open('$OUT/lease.json'))['ops'])")"

# ---------------------------------------------------------------- the tune, OOM classes, the other memory points
kit tune $(( budget - 75 ))  # its --time-budget keeps one trial and the fresh confirmation back (points.py)
kit oom $(( budget - 20 ))  # the first probe needs ~40 s (it fails at engine init)
kit memory $(( budget - 12 )) --memory-set rest

# ---------------------------------------------------------------- built ops for the next lease
if [ "$dry" = 0 ]; then
    run_stage pack-ops "$budget" bash -c '
        cp -a "$TORCH_EXTENSIONS_DIR" "$0/ops" && find "$0/ops" \( -name "*.so" -o -name "*.o" \) -exec strip --strip-debug {} + 2>/dev/null
        rm -f "$0"/ops/*/lock; echo "$1" > "$0/ops/cpu-stamp.txt"; tar czf "$0/gpu-ops.tgz" -C "$0/ops" . && size=$(stat -c %s "$0/gpu-ops.tgz")
        [ "$size" -lt $((15 * 1024 * 1024)) ] && mv "$0/gpu-ops.tgz" "$OUT/" || echo "gpu-ops.tgz: $size bytes, over the 16 MiB a file may have"' \
        "$SCRATCH" "$stamp"
fi
finish
[ -n "${LEASE_SCRATCH:-}" ] || rm -rf "$SCRATCH"
say "done in $(elapsed)s of ${budget}s"
