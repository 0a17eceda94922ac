"""ZeRO-3's gathered parameters at the forward/backward turn (autotune.estimate.stage3_retention).

The hand-built summaries are Llama-shaped (gated MLP, untied output layer unless a test says otherwise); the
slow test holds the replay to DeepSpeed's own gathered state on the CPU backend.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.fakes.models import summary, target

from autotune.core.ladder import Candidate, Rung
from autotune.estimate import EstimateSettings, estimate
from autotune.estimate.knobs import ZeroKnobs
from autotune.estimate.margin import LIVE_PARAMS_RELATIVE
from autotune.estimate.stage3_retention import gathered_at_turn, retained_at_turn, step_trace
from autotune.models import ModelSummary

REPO = Path(__file__).resolve().parents[1]
HIDDEN, INTERMEDIATE = 1024, 2816
BLOCK = 4 * HIDDEN * HIDDEN + 3 * HIDDEN * INTERMEDIATE  # q, k, v, o + gate, up, down


def llama(vocab: int, layers: int, tied: bool = False, decoder_layers: int = 0) -> ModelSummary:
    embedding = vocab * HIDDEN
    total = embedding * (1 if tied else 2) + (layers + decoder_layers) * BLOCK
    return summary(
        total_params=total,
        trainable_params=total,
        embedding_params=embedding,
        vocab_size=vocab,
        hidden_size=HIDDEN,
        num_layers=layers,
        num_decoder_layers=decoder_layers,
        num_heads=16,
        num_kv_heads=16,
        head_dim=64,
        intermediate_size=INTERMEDIATE,
        tied_embeddings=tied,
        family="encoder-decoder" if decoder_layers else "decoder-only",
    )


def test_the_output_layer_is_held_from_its_forward_to_its_backward_whatever_its_size():
    model = llama(vocab=128_000, layers=8)
    output = 128_000 * HIDDEN
    # under twice the output layer: its forward and backward fill the distance, so no block reaches its next use
    assert retained_at_turn(model, 2 * output - 1, grad_checkpointing=False) == output
    assert retained_at_turn(model, 1, grad_checkpointing=False) == output  # the very next module is always seen
    assert retained_at_turn(model, 0, grad_checkpointing=False) == 0  # a distance of 0 keeps nothing


def test_a_model_under_the_reuse_distance_stays_whole():
    for tied in (False, True):
        model = llama(vocab=32_000, layers=4, tied=tied)
        assert retained_at_turn(model, 10**9, grad_checkpointing=False) == model.total_params


def test_a_large_model_keeps_about_half_the_distance_or_a_third_with_checkpointing():
    model = llama(vocab=1_000, layers=400)  # 5B parameters of uniform blocks, a negligible output layer
    distance = 10**9
    plain = retained_at_turn(model, distance, grad_checkpointing=False)
    ckpt = retained_at_turn(model, distance, grad_checkpointing=True)
    # a block's next use comes after the blocks behind it run forward and backward (and recompute): 2 or 3 passes
    assert abs(plain - distance / 2) <= BLOCK
    assert abs(ckpt - distance / 3) <= BLOCK


def test_a_tied_embedding_is_gathered_at_the_turn():
    model = llama(vocab=250_000, layers=24, tied=True)  # BLOOM-like: the embedding is the output layer
    retained = retained_at_turn(model, 10**9, grad_checkpointing=False)
    assert retained >= model.embedding_params
    assert retained < model.total_params


def test_the_trace_embeds_again_for_the_decoder_and_turns_at_the_output_layer():
    model = llama(vocab=32_000, layers=2, decoder_layers=2)
    trace, turn = step_trace(model, grad_checkpointing=True)
    blocks = [use.block for use in trace]
    assert blocks[turn] == "output" and blocks[turn + 1] == "output"
    assert blocks[:turn].count("embedding") == 2  # encoder and decoder inputs share one embedding
    assert blocks.count("decoder.1.q") == 3  # forward, recomputation, backward


def test_prefetching_adds_what_is_not_yet_gathered_up_to_the_live_limit():
    model = llama(vocab=32_000, layers=40)
    retained, prefetched = gathered_at_turn(model, 10**8, False, prefetch_bucket=5 * 10**7, max_live=10**9)
    assert retained > 0 and prefetched == 5 * 10**7
    _, capped = gathered_at_turn(model, 10**8, False, prefetch_bucket=5 * 10**7, max_live=retained + 10)
    assert capped == 10
    whole, nothing_left = gathered_at_turn(model, 10**12, False, prefetch_bucket=5 * 10**7, max_live=10**12)
    assert whole == model.total_params and nothing_left == 0


@pytest.mark.slow
def test_the_replay_matches_deepspeeds_gathered_state(tmp_path: Path):
    """Real DeepSpeed ZeRO-3 on two CPU ranks (benchmarks/stage3_retention_cpu.py, about a minute for these
    cases): what DeepSpeed holds gathered at the loss is what the replay says, within the component's margin."""
    out = tmp_path / "retention.json"
    subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "stage3_retention_cpu.py"), "--only", "distance", "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=900,
    )
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) >= 8
    for row in rows:
        assert abs(row["predicted_elements"] - row["deepspeed_gathered_elements"]) <= (
            LIVE_PARAMS_RELATIVE * row["deepspeed_gathered_elements"]
        ), row


def test_a_prefetch_bucket_of_zero_in_a_users_config_prefetches_nothing():
    model, where = llama(vocab=32_000, layers=40), target(8)
    knobs = ZeroKnobs.from_ds_config(
        {"stage": 3, "stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0}, HIDDEN, stage=3
    )
    parts = estimate(model, where, Candidate(Rung.Z3, 1), EstimateSettings(seq_len=512, knobs=knobs)).gpu_components
    assert "prefetched_params" not in parts and "live_params" not in parts
    default = estimate(model, where, Candidate(Rung.Z3, 1), EstimateSettings(seq_len=512)).gpu_components
    assert default["prefetched_params"] > 0
