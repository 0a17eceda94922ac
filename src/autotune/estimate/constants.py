"""Fixed overheads of a training process: each figure says where and how it was measured.

Figures taken on the dev machine were measured with the scripts named below; GPU-side figures could not
be measured in this project yet (no GPU), so they cite public measurements and are replaced, per run,
by what `calibrate` learns from the first real trial.
"""

from __future__ import annotations

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

# CUDA-side overheads (context, NCCL, caching allocator) depend on the stack: see estimate/runtime.py.
