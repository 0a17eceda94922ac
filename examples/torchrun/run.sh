#!/usr/bin/env bash
# Tune, then train with torchrun, without a scheduler. Run the same command on every node:
#
#   one node:   MODEL=gpt2-large TRAIN_SCRIPT=train_hf.py ./examples/torchrun/run.sh
#   two nodes:  NNODES=2 NODE_RANK=0 NODELIST=host0,host1 MASTER_ADDR=host0 MASTER_PORT=29617 ./examples/torchrun/run.sh  # host0
#               NNODES=2 NODE_RANK=1 NODELIST=host0,host1 MASTER_ADDR=host0 MASTER_PORT=29617 ./examples/torchrun/run.sh  # host1
#   CPU only:   AUTOTUNE_DEVICE=cpu GPUS_PER_NODE=2 MODEL=tiny-gpt2 ... (DeepSpeed's CPU backend; tests/test_examples.py)
#
# Every node runs the hook; one process tunes, the others wait for its result in the shared
# directory. With several nodes the tuner's trials span them through the deepspeed launcher and a
# hostfile built from NODELIST (passwordless ssh and pdsh between the nodes, as for `deepspeed --hostfile`).
#
# The training script gets the config its kind reads (docs/cluster.md):
#   SCRIPT_KIND=hf         an HF Trainer script:   --deepspeed "$AUTOTUNE_HF_CONFIG" $AUTOTUNE_HF_ARGS
#   SCRIPT_KIND=deepspeed  a script built with deepspeed.add_config_arguments:
#                                                  --deepspeed --deepspeed_config "$AUTOTUNE_DS_CONFIG"
set -euo pipefail

MODEL=${MODEL:-gpt2-large}
SEQ_LEN=${SEQ_LEN:-2048}
TRAIN_SCRIPT=${TRAIN_SCRIPT:-train.py}
SCRIPT_KIND=${SCRIPT_KIND:-hf}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
NODELIST=${NODELIST:-}
SHARED=${AUTOTUNE_SHARED:-$HOME/autotune-shared}   # on a filesystem every node sees when NNODES > 1
OUT=${AUTOTUNE_OUT:-autotune-out/ds_config.json}    # this node's copy (same bytes on every node)

hook_args=(--model "$MODEL" --seq-len "$SEQ_LEN" --cache-dir "$SHARED" --out "$OUT" --nodes "$NNODES"
           --time-budget "${AUTOTUNE_TIME_BUDGET:-1800}" --print-env)
if [[ ${AUTOTUNE_DEVICE:-cuda} == cpu ]]; then
    export DS_ACCELERATOR=cpu   # DeepSpeed's CPU backend for the trials and the training
    GPUS_PER_NODE=${GPUS_PER_NODE:-1}
    hook_args+=(--device cpu --memory-budget "${AUTOTUNE_MEMORY_BUDGET:-2GiB}")
else
    GPUS_PER_NODE=${GPUS_PER_NODE:-$(nvidia-smi --list-gpus | wc -l)}
fi
hook_args+=(--gpus "$GPUS_PER_NODE")
if [ -n "$NODELIST" ]; then
    hook_args+=(--nodelist "$NODELIST")
fi
read -r -a extra_hook_args <<< "${AUTOTUNE_HOOK_ARGS:-}"   # e.g. "--micro-batches 1,2 --rungs z0"
# Two steps, so that a failing hook stops the script under `set -e`.
hook_env=$(autotune hook "${hook_args[@]}" "${extra_hook_args[@]}")
eval "$hook_env"   # AUTOTUNE_DS_CONFIG, AUTOTUNE_HF_CONFIG, AUTOTUNE_HF_ARGS, AUTOTUNE_WORLD_SIZE

if (( AUTOTUNE_WORLD_SIZE != NNODES * GPUS_PER_NODE )); then
    echo "the config is valid for world size $AUTOTUNE_WORLD_SIZE, not $NNODES x $GPUS_PER_NODE" >&2
    exit 2
fi
case $SCRIPT_KIND in
    hf)        config_args=(--deepspeed "$AUTOTUNE_HF_CONFIG")
               read -r -a hf_args <<< "$AUTOTUNE_HF_ARGS"; config_args+=("${hf_args[@]}") ;;
    deepspeed) config_args=(--deepspeed --deepspeed_config "$AUTOTUNE_DS_CONFIG") ;;
    *)         echo "SCRIPT_KIND must be hf or deepspeed, not $SCRIPT_KIND" >&2; exit 2 ;;
esac
read -r -a train_args <<< "${TRAIN_ARGS:-}"   # the script's own flags

# One node: torchrun --standalone picks a free rendezvous port, so two jobs on a node do not collide on 29500.
# Several nodes: every node must be given the same MASTER_PORT.
if (( NNODES == 1 )); then
    rendezvous=(--standalone)
else
    rendezvous=(--node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "${MASTER_PORT:?set MASTER_PORT}")
fi
torchrun --nnodes "$NNODES" "${rendezvous[@]}" --nproc-per-node "$GPUS_PER_NODE" \
    "$TRAIN_SCRIPT" "${config_args[@]}" "${train_args[@]}"
