"""The scenarios of the search-quality benchmark: each one a case where a different thing decides."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_sim.machine import DGX_A100, DGX_H100, G5_12XLARGE, WORKSTATION_4090, NodeType


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str  # autotune built-in profile
    node: NodeType
    nodes: int
    seq_len: int
    global_batch: int | None = None
    what: str = ""  # what the scenario exercises


SCENARIOS = (
    Scenario(
        "zero3-beats-zero2-offload",
        "llama-2-13b",
        DGX_A100,
        1,
        1024,
        what="ZeRO-0..2 do not fit; ZeRO-2 + offload and ZeRO-3 reach the same micro-batch, and ZeRO-3 "
        "avoids the CPU Adam step (the ladder's A1 drops ZeRO-3 unmeasured)",
    ),
    Scenario(
        "zero3-vs-zero2-small-batches",
        "llama-2-7b",
        DGX_A100,
        1,
        512,
        what="ZeRO-2 fits only small micro-batches; ZeRO-2 + offload and ZeRO-3 reach larger ones",
    ),
    Scenario(
        "offload-buys-micro-batch",
        "opt-1.3b",
        WORKSTATION_4090,
        1,
        2048,
        global_batch=64,
        what="two PCIe-only 24 GB cards, fixed global batch: offload frees memory for a larger micro-batch "
        "and the CPU step is amortised over the accumulation",
    ),
    Scenario(
        "checkpointing-wins",
        "gpt2-large",
        WORKSTATION_4090,
        1,
        1024,
        what="RTX 4090 24 GB: without checkpointing micro-batch 6 fits (4 on powers of two), with checkpointing 25 "
        "(16): on integers, micro-batch 6 without the recompute beats checkpointing; on powers of two it did not",
    ),
    Scenario(
        "offload-and-checkpointing",
        "llama-2-7b",
        G5_12XLARGE,
        1,
        1024,
        what="7B on 4x A10G 24 GB: only offload rungs fit; checkpointing buys 8x the micro-batch",
    ),
    Scenario(
        "memory-not-binding",
        "gpt2-large",
        DGX_A100,
        1,
        1024,
        what="everything fits at ZeRO-0; the search should stop after a few trials",
    ),
    Scenario(
        "multi-node-infiniband",
        "llama-2-13b",
        DGX_A100,
        2,
        2048,
        what="2 DGX A100 nodes over 8x HDR InfiniBand: ZeRO-3 collectives cross nodes",
    ),
    Scenario(
        "multi-node-slow-network",
        "opt-1.3b",
        G5_12XLARGE,
        2,
        1024,
        global_batch=256,
        what="2 g5 nodes over 40 Gb/s Ethernet: inter-node collectives dominate; fewer, larger steps win",
    ),
    Scenario(
        "partial-offload-beats-neighbours",
        "llama-2-7b",
        G5_12XLARGE,
        1,
        256,
        global_batch=16,
        what="7B on 4x A10G 24 GB, short sequences, global batch 16: ZeRO-3 does not fit, full optimizer offload "
        "puts CPU Adam (6 cores per GPU) on the critical path, ZeRO-2 + offload also moves the whole optimizer; "
        "offloading just enough of it (a ratio near 0.6) is fastest",
    ),
    Scenario(
        "zeropp-wins-across-nodes",
        "opt-1.3b",
        G5_12XLARGE,
        2,
        1024,
        global_batch=32,
        what="2 g5 nodes over 40 Gb/s Ethernet, global batch 32 (micro-batch at most 4 per rank): ZeRO-3's "
        "all-gathers cross the slow link every micro-step; ZeRO++ (int8 weights, hpZ in-node backward gather, "
        "int4 gradients) cuts that traffic and wins",
    ),
    Scenario(
        "boundary-between-powers-fixed-batch",
        "opt-1.3b",
        WORKSTATION_4090,
        1,
        1024,
        global_batch=48,
        what="two RTX 4090s, global batch 48 (24 per GPU): the micro-batch must divide 24; 12 with checkpointing "
        "fits and is fastest, between the powers of two 8 and 16",
    ),
    Scenario(
        "boundary-at-11",
        "gpt2-xl",
        WORKSTATION_4090,
        1,
        1024,
        what="gpt2-xl on two RTX 4090s: with checkpointing micro-batch 11 is the largest that fits, far from 8 and 16",
    ),
    Scenario(
        "no-checkpointing-between-powers",
        "gpt2-large",
        WORKSTATION_4090,
        1,
        2048,
        what="gpt2-large at 2048 tokens on two RTX 4090s: without checkpointing micro-batch 3 fits (2 on powers of "
        "two) and beats every checkpointed micro-batch; on powers of two checkpointing at 8 looked best",
    ),
    Scenario(
        "eight-nodes-30b",
        "opt-30b",
        DGX_A100,
        8,
        2048,
        global_batch=1024,
        what="OPT-30B on 8 DGX A100 40GB (64 GPUs), 1024 x 2048 tokens per step (2M tokens): ZeRO-3 fits only once "
        "its partitions are split over more than one node, so one node alone sees only offload",
    ),
    Scenario(
        "sixty-four-nodes-70b",
        "llama-2-70b",
        DGX_H100,
        64,
        4096,
        global_batch=1024,
        what="Llama-2-70B on 64 DGX H100 (512 GPUs), 4M tokens per step (1024 x 4096, Llama 2's batch: Touvron et "
        "al. 2023, section 2.2): micro-batch 1 or 2 per rank; ZeRO-3 fits at this world size and nowhere near one node",
    ),
)
