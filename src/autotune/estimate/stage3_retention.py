"""Which gathered parameters ZeRO-3 still holds at the forward/backward turn, by replaying its release rule.

The peak of everything else (activations, logits) is at the turn, so the parameters held then add to it. The step's
module trace is replayed as DeepSpeed records it and DeepSpeed's `__params_to_release` rule applied to it (deepspeed
0.19.8 partitioned_param_coordinator.py); checked against DeepSpeed's own gathered state on the CPU backend
(benchmarks/stage3_retention_cpu.py).

Reasoning and sources: estimate/README.md#stage3_retention
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.models import ModelSummary


@dataclass(frozen=True)
class Use:
    """One module use in the step's trace: which parameter block, and how many elements it gathers."""

    block: str
    elements: int


def output_layer_elements(model: ModelSummary) -> int:
    """The untied output layer (vocabulary x hidden); 0 when it shares the embedding's weight."""
    return 0 if model.tied_embeddings else model.vocab_size * model.hidden_size


def _attention(model: ModelSummary, prefix: str = "") -> list[tuple[str, int]]:
    """q, k, v, o projections (grouped-query k and v are narrower)."""
    width = model.num_heads * model.head_dim
    kv_width = model.num_kv_heads * model.head_dim
    return [
        (f"{prefix}q", model.hidden_size * width),
        (f"{prefix}k", model.hidden_size * kv_width),
        (f"{prefix}v", model.hidden_size * kv_width),
        (f"{prefix}o", width * model.hidden_size),
    ]


def _block_modules(model: ModelSummary) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """An encoder (or decoder-only) block's and a decoder block's parameter-holding modules in forward order,
    with their elements: self-attention, a decoder's cross-attention, then the MLP, which holds what the
    summary's count leaves (spread over gate, up, down when that is closer to 3 x hidden x intermediate than
    to 2, else fc, proj)."""
    self_attention = _attention(model)
    cross_attention = _attention(model, prefix="cross_") if model.num_decoder_layers else []
    blocks = model.total_params - model.embedding_params - output_layer_elements(model)
    attention = model.num_layers * sum(size for _, size in self_attention) + model.num_decoder_layers * sum(
        size for _, size in self_attention + cross_attention
    )
    mlp = (blocks - attention) // max(1, model.total_layers)
    if mlp <= 0:  # a layout this does not know: one module per block
        whole = [("all", max(0, blocks) // max(1, model.total_layers))]
        return whole, whole
    matrix = model.hidden_size * model.intermediate_size
    names = ("gate", "up", "down") if abs(mlp - 3 * matrix) < abs(mlp - 2 * matrix) else ("fc", "proj")
    mlp_modules = [(name, mlp // len(names)) for name in names]
    return self_attention + mlp_modules, self_attention + cross_attention + mlp_modules


def weight_matrices(model: ModelSummary) -> list[int]:
    """Elements of each weight matrix in the same layout (embedding, every block's modules, an untied output
    layer); norms and biases left out (under the persistence threshold: README.md#stage3_retention)."""
    encoder_modules, decoder_modules = _block_modules(model)
    sizes = [model.embedding_params]
    sizes += [size for _, size in encoder_modules] * model.num_layers
    sizes += [size for _, size in decoder_modules] * model.num_decoder_layers
    if not model.tied_embeddings:
        sizes.append(output_layer_elements(model))
    return sizes


def step_trace(model: ModelSummary, grad_checkpointing: bool) -> tuple[list[Use], int]:
    """The step's module uses in order, and the index of the output layer's forward (the turn).

    Forward: embedding, blocks, output layer; an encoder-decoder model embeds again for its decoder (T5's shared
    embedding). Backward in reverse; a checkpointed block is recomputed (its forward hooks fetch it again)
    right before its backward.
    """
    encoder_modules, decoder_modules = _block_modules(model)
    embedding = Use("embedding", model.embedding_params)
    output = (
        Use("embedding", model.embedding_params)
        if model.tied_embeddings
        else Use("output", output_layer_elements(model))
    )

    def blocks(prefix: str, count: int, modules: list[tuple[str, int]]) -> list[list[Use]]:
        return [[Use(f"{prefix}.{i}.{name}", size) for name, size in modules] for i in range(count)]

    encoder = blocks("encoder", model.num_layers, encoder_modules)
    decoder = blocks("decoder", model.num_decoder_layers, decoder_modules)

    def forward_of(stack: list[list[Use]]) -> list[Use]:
        return [use for block in stack for use in block]

    def backward_of(stack: list[list[Use]]) -> list[Use]:
        recompute = grad_checkpointing
        return [use for block in reversed(stack) for use in (block if recompute else []) + block[::-1]]

    forward = [embedding, *forward_of(encoder)] + ([embedding, *forward_of(decoder)] if decoder else []) + [output]
    backward = [output, *backward_of(decoder)] + ([embedding] if decoder else []) + backward_of(encoder)
    return forward + backward + [embedding], len(forward) - 1


def kept_after(trace: list[Use], reuse_distance: int) -> list[bool]:
    """`__params_to_release` for every use in the trace: is its block used again before the uses after it add
    up to the reuse distance? The coordinator walks the modules after the current one and stops at the first
    where what it has walked is >= the distance, so the next use is reached exactly when the elements strictly
    between the two uses are under it. One pass from the end, with prefix sums."""
    before = [0]  # before[i]: elements of trace[:i]
    for use in trace:
        before.append(before[-1] + use.elements)
    kept = [False] * len(trace)
    next_use: dict[str, int] = {}
    for position in range(len(trace) - 1, -1, -1):
        block = trace[position].block
        following = next_use.get(block)
        if following is not None:
            kept[position] = before[following] - before[position + 1] < reuse_distance
        next_use[block] = position
    return kept


def retained_at_turn(model: ModelSummary, reuse_distance: int, grad_checkpointing: bool) -> int:
    """Elements still gathered when the loss is computed: each block whose latest use kept it."""
    trace, turn = step_trace(model, grad_checkpointing)
    kept = kept_after(trace, reuse_distance)
    latest: dict[str, int] = {}
    for position, use in enumerate(trace[: turn + 1]):
        latest[use.block] = position
    return sum(trace[p].elements for p in latest.values() if kept[p])


def gathered_at_turn(
    model: ModelSummary, reuse_distance: int, grad_checkpointing: bool, prefetch_bucket: int, max_live: int
) -> tuple[int, int]:
    """(retained, prefetched) elements at the turn. The output layer's backward fetch then prefetches up to
    prefetch_bucket elements not yet gathered, while the gathered total stays under max_live (coordinator
    lines 451-476: already-gathered parameters in the queue are skipped and not counted)."""
    retained = retained_at_turn(model, reuse_distance, grad_checkpointing)
    prefetched = min(prefetch_bucket, max(0, model.total_params - retained), max(0, max_live - retained))
    return retained, prefetched
