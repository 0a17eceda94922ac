"""Fixed overheads of a training process: each figure says where and how it was measured.

Figures taken on the dev machine were measured with the scripts named below; GPU-side figures could not
be measured in this project yet (no GPU), so they cite public measurements and are replaced, per run,
by what `calibrate` learns from the first real trial.
"""

from __future__ import annotations

from autotune.units import MiB

# --- CPU backend (DS_ACCELERATOR=cpu, gloo) ------------------------------------------------------------
# Peak RSS of one DeepSpeed rank beyond its model: python + torch + deepspeed + transformers imported, gloo
# initialised, engine built, optimizer steps taken. Measured by `python benchmarks/estimate_accuracy.py
# --baseline`: peak VmHWM of the trial worker training tiny-gpt2 (0.2M parameters; its predicted states,
# buffers and activations, 8.4 MB, subtracted), ZeRO-0, micro-batch 1, seq 128, bf16, default glibc;
# median of 3 runs (469.9 / 470.7 / 471.1 MB) on a 2-core Xeon VM, 2026-11-22, Python 3.11.7,
# torch 2.13.0+cpu, deepspeed 0.19.8, transformers 5.23.0. Re-measured in the accuracy run recorded in
# benchmarks/results/estimate_accuracy_cpu.json (471.9 / 472.2 / 472.5 MB): within 0.4%.
CPU_PROCESS_BASELINE_BYTES = 470_664_192

# Bytes per element of the s^2 attention terms when torch's CPU sdpa falls back to its math kernel
# (dropout > 0, or an additive bias such as T5's relative positions): the kernel upcasts bf16 to fp32 and
# keeps the softmax output, the dropout mask and the dropped-out probabilities. Measured with
# torch.distributed._tools.mem_tracker.MemTracker around one F.scaled_dot_product_attention call
# (b=1, heads=4, s=512, d=64, fp32 and bf16) on torch 2.13.0+cpu; tests/test_estimate_activations.py re-checks it.
CPU_MATH_SDPA_BYTES_WITH_DROPOUT = 14
CPU_MATH_SDPA_BYTES_NO_DROPOUT = 6

# --- CUDA (not measurable here: public measurements, corrected per run by calibrate()) ---------------
# CUDA context with lazy module loading: 426 MiB shown by nvidia-smi after torch.cuda.mem_get_info(),
# PyTorch 2.10.0+cu130 on an RTX 6000 Ada (unslothai/unsloth-zoo PR #1053, 2026); PyTorch PR #86509
# reports 287,047,680 bytes for the same with CUDA 11.7. We take the newer, larger figure.
CUDA_CONTEXT_BYTES = 426 * MiB

# NCCL communicator buffers per GPU after a first all-reduce: 544 MB for a 2-rank group, 688 MB for groups
# of more ranks, 4x A100 with NVLink (NVIDIA/nccl issue #964, 2023). DeepSpeed's data-parallel group is one
# such communicator; a single rank has no peers and allocates none.
NCCL_TWO_RANK_BYTES = 544 * 10**6
NCCL_MULTI_RANK_BYTES = 688 * 10**6

# The caching allocator reserves more than it hands out: blocks round up to 512 B / 2 MiB and large
# allocations are carved from 20 MiB segments (c10/cuda/CUDACachingAllocator.cpp). 5% of the allocated
# peak is a prior, NOT a measurement; calibrate() replaces it with the measured offset after one trial.
ALLOCATOR_SLACK_FRACTION = 0.05
