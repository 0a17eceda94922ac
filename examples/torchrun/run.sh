#!/usr/bin/env bash
# Tune, then train with torchrun, without a scheduler. Run the same command on every node:
#
#   one node:   MODEL=gpt2-large ./examples/torchrun/run.sh
#   two nodes:  NNODES=2 NODE_RANK=0 NODELIST=host0,host1 MASTER_ADDR=host0 ./examples/torchrun/run.sh   # on host0
#               NNODES=2 NODE_RANK=1 NODELIST=host0,host1 MASTER_ADDR=host0 ./examples/torchrun/run.sh   # on host1
#
# Every node runs the hook; one process tunes, the others wait for its result in the shared
# directory. With several nodes the tuner's trials span them through the deepspeed launcher and a
# hostfile built from NODELIST (passwordless ssh and pdsh between the nodes, as for `deepspeed --hostfile`).
set -euo pipefail

MODEL=${MODEL:-gpt2-large}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
GPUS_PER_NODE=${GPUS_PER_NODE:-$(nvidia-smi --list-gpus | wc -l)}
NODELIST=${NODELIST:-}
SHARED=${AUTOTUNE_SHARED:-$HOME/autotune-shared}   # on a filesystem every node sees when NNODES > 1

hook_args=(--model "$MODEL" --cache-dir "$SHARED" --out "$SHARED/ds_config.json"
           --gpus "$GPUS_PER_NODE" --nodes "$NNODES" --time-budget 1800 --print-env)
if [ -n "$NODELIST" ]; then
    hook_args+=(--nodelist "$NODELIST")
fi
# Two steps, so that a failing hook stops the script under `set -e`.
hook_env=$(autotune hook "${hook_args[@]}")
eval "$hook_env"   # sets AUTOTUNE_DS_CONFIG

torchrun --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$GPUS_PER_NODE" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    train.py --deepspeed "$AUTOTUNE_DS_CONFIG"
