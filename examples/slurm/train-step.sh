#!/usr/bin/env bash
# Step 2 of train.sbatch, one per node: torchrun starts this node's ranks of the training script with the config
# `autotune hook --print-env` exported. Kept apart so that it runs the same without SLURM (tests/test_examples.py).
#
# Reads: AUTOTUNE_DS_CONFIG, AUTOTUNE_HF_CONFIG, AUTOTUNE_HF_ARGS, AUTOTUNE_WORLD_SIZE (from the hook),
#        TRAIN_SCRIPT, SCRIPT_KIND (hf: an HF Trainer script; deepspeed: a script built with
#        deepspeed.add_config_arguments), TRAIN_ARGS (the script's own flags), NNODES, RANKS_PER_NODE,
#        MASTER_ADDR, MASTER_PORT, RDZV_ID.
set -euo pipefail

if (( AUTOTUNE_WORLD_SIZE != NNODES * RANKS_PER_NODE )); then
    echo "the config is valid for world size $AUTOTUNE_WORLD_SIZE, this job has $NNODES x $RANKS_PER_NODE ranks" >&2
    exit 2
fi
case ${SCRIPT_KIND:-hf} in
    hf)        CONFIG_ARGS=(--deepspeed "$AUTOTUNE_HF_CONFIG") ;;
    deepspeed) CONFIG_ARGS=(--deepspeed --deepspeed_config "$AUTOTUNE_DS_CONFIG") ;;
    *)         echo "SCRIPT_KIND must be hf or deepspeed, not ${SCRIPT_KIND}" >&2; exit 2 ;;
esac
read -r -a HF_ARGS <<< "$AUTOTUNE_HF_ARGS"   # the TrainingArguments flags the .hf.json's batch values need
[[ ${SCRIPT_KIND:-hf} == hf ]] || HF_ARGS=()
read -r -a EXTRA <<< "${TRAIN_ARGS:-}"
exec torchrun --nnodes "$NNODES" --nproc-per-node "$RANKS_PER_NODE" \
    --rdzv-id "$RDZV_ID" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
    "$TRAIN_SCRIPT" "${CONFIG_ARGS[@]}" "${HF_ARGS[@]}" "${EXTRA[@]}"
