#!/bin/bash
#SBATCH --nodes=2
#SBATCH --export=ALL,NCCL_DEBUG=INFO
export NCCL_SOCKET_IFNAM=eth0
export PYTORCH_CUDA_ALOC_CONF=expandable_segments:True
export CUDA_DEVICE_MAX_CONNECTIONS=1 OMP_NUM_THREADS=8
export DEEPSPEED_ZERO_STAGE=3
export HF_HOME=/scratch/hf
MASTER_PORT=29500 deepspeed train.py --deepspeed ds_config.json
