import json

import pytest

from autotune.errors import UserError
from autotune.models import resolve_model, summarize
from autotune.models.architecture import build_model


def test_profile_counts_match_published_figures() -> None:
    t5 = summarize(resolve_model("t5-3b"))
    assert t5.total_params == 2_851_598_336 and t5.family == "encoder-decoder" and t5.tied_embeddings
    assert (t5.num_layers, t5.num_decoder_layers, t5.num_heads, t5.head_dim) == (24, 24, 32, 128)
    llama = summarize(resolve_model("llama-2-7b"))
    assert llama.total_params == 6_738_415_616 and llama.family == "decoder-only" and not llama.tied_embeddings
    assert (llama.hidden_size, llama.num_layers, llama.num_kv_heads, llama.vocab_size) == (4096, 32, 32, 32000)
    assert summarize(resolve_model("bert-large")).family == "encoder"


def test_largest_layer_is_deepspeeds_definition() -> None:
    """DeepSpeed's estimator takes the most parameters owned directly by one module."""
    source = resolve_model("gpt2")
    model, _ = build_model(source.config, source.architecture)
    expected = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    assert summarize(source).largest_layer_params == expected == 50257 * 768


def test_local_directory_and_config_file(tmp_path) -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "architectures": ["LlamaForCausalLM"],
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    from_dir = summarize(resolve_model(str(tmp_path)))
    from_file = summarize(resolve_model(str(tmp_path / "config.json")))
    assert from_dir.total_params == from_file.total_params > 0
    assert from_dir.num_kv_heads == 2 and from_dir.origin == "local"


def test_hub_cache_is_read_offline(tmp_path, monkeypatch) -> None:
    snapshot = tmp_path / "models--acme--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (tmp_path / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "models--acme--tiny" / "refs" / "main").write_text("abc123")
    config = {"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2, "vocab_size": 100, "n_positions": 64}
    (snapshot / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    source = resolve_model("acme/tiny")
    assert source.origin == "hub-cache" and not source.trust_remote_code
    assert summarize(source).vocab_size == 100


def test_unknown_model_suggests_close_names() -> None:
    with pytest.raises(UserError, match=r"did you mean.*t5-3b"):
        resolve_model("t5-3bb")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "malformed"),
        ("[1, 2]", "malformed"),
        ('{"hidden_size": 4}', "model_type"),
        ('{"model_type": "no-such-arch"}', "unsupported model_type"),
    ],
)
def test_bad_config_json(tmp_path, content: str, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(UserError, match=message):
        summarize(resolve_model(str(path)))


def test_summary_cache_returns_the_same_summary() -> None:
    first = summarize(resolve_model("tiny-gpt2"))
    second = summarize(resolve_model("tiny-gpt2"))
    assert first == second


def test_shipped_summaries_equal_a_fresh_meta_build() -> None:
    """profiles/summaries.json is derived data: regenerate with `python -m autotune.models.regenerate`."""
    from autotune.models.profiles import model_profiles
    from autotune.models.shipped import shipped_summary

    for profile in model_profiles().values():
        source = resolve_model(profile.name)
        assert shipped_summary(source) == summarize(source, use_cache=False), profile.name
