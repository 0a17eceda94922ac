"""Issue 46: --trust-remote-code on a local directory with `auto_map` is built from that directory's own code.

It was refused with "remote-code configs are only supported from a local directory or the HF cache" although the
input was a local directory. No network: transformers loads the classes from the directory's .py files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.errors import UserError
from autotune.models import resolve_model, summarize

CONFIGURATION = """
from transformers import GPT2Config


class TinyRemoteConfig(GPT2Config):
    model_type = "tiny_remote"
"""
MODELING = """
from transformers import GPT2LMHeadModel

from .configuration_tiny_remote import TinyRemoteConfig


class TinyRemoteForCausalLM(GPT2LMHeadModel):
    config_class = TinyRemoteConfig
"""


def _remote_code_dir(tmp_path: Path) -> Path:
    model = tmp_path / "tiny-remote"
    model.mkdir()
    (model / "configuration_tiny_remote.py").write_text(CONFIGURATION)
    (model / "modeling_tiny_remote.py").write_text(MODELING)
    config = {
        "model_type": "tiny_remote", "architectures": ["TinyRemoteForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_tiny_remote.TinyRemoteConfig",
                     "AutoModelForCausalLM": "modeling_tiny_remote.TinyRemoteForCausalLM"},
        "n_layer": 2, "n_head": 2, "n_embd": 16, "vocab_size": 128, "n_positions": 64,
    }  # fmt: skip
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_a_local_directory_with_auto_map_builds_from_its_own_code(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may come from the network
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    source = resolve_model(str(_remote_code_dir(tmp_path)), trust_remote_code=True)
    summary = summarize(source, use_cache=False)
    assert summary.architecture == "TinyRemoteForCausalLM" and summary.num_layers == 2 and summary.hidden_size == 16
    assert summary.trust_remote_code


def test_without_trust_remote_code_the_unknown_type_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unsupported model_type 'tiny_remote'"):
        resolve_model(str(_remote_code_dir(tmp_path)))
