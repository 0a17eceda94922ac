"""Model summaries and targets built by hand, so the estimate's tests need neither transformers nor a GPU.

`summary()` is a GPT-2-like ModelSummary (100M parameters) any field of which a test overrides; `LLAMA_70B` is
Llama-2-70B's published shape (its HF config); `target()` is a generic GPU target of the given memory. They encode
no belief of the estimate: only the model's shape and the machine's size."""

from __future__ import annotations

from autotune.core.units import GiB
from autotune.hardware.specs import Target, generic_gpu
from autotune.models import ModelSummary

GPT_CONFIG = {"model_type": "gpt2", "activation_function": "gelu", "attn_pdrop": 0.1, "resid_pdrop": 0.1}


def summary(**overrides) -> ModelSummary:
    """A GPT-2-like summary built by hand, so no test here needs transformers."""
    fields = dict(
        name="hand-gpt",
        origin="test",
        architecture="GPT2LMHeadModel",
        model_type="gpt2",
        family="decoder-only",
        total_params=100_000_000,
        trainable_params=100_000_000,
        largest_layer_params=10_000_000,
        embedding_params=10_000_000,
        hidden_size=1024,
        num_layers=8,
        num_decoder_layers=0,
        num_heads=16,
        num_kv_heads=16,
        head_dim=64,
        intermediate_size=4096,
        vocab_size=32000,
        max_positions=2048,
        tied_embeddings=False,
        fingerprint="test",
        config=dict(GPT_CONFIG),
    )
    fields.update(overrides)
    return ModelSummary(**fields)


def target(gpus: int = 1, nodes: int = 1, memory: int = 80 * GiB, **overrides) -> Target:
    return Target(generic_gpu(memory), gpus_per_node=gpus, nodes=nodes, free_memory_bytes=memory, **overrides)


LLAMA_70B = summary(
    name="llama-2-70b",
    architecture="LlamaForCausalLM",
    model_type="llama",
    total_params=68_976_648_192,
    trainable_params=68_976_648_192,
    largest_layer_params=262_144_000,
    embedding_params=262_144_000,
    hidden_size=8192,
    num_layers=80,
    num_heads=64,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=28672,
    vocab_size=32000,
    max_positions=4096,
    config={"model_type": "llama", "hidden_act": "silu", "rms_norm_eps": 1e-5},
)
