"""Resolve `--model` to an architecture and summarise it from a meta-device build."""

from autotune.models.model_summary import ModelSummary, summarize, summarize_model
from autotune.models.resolve import ModelSource, resolve_model

__all__ = ["ModelSource", "ModelSummary", "resolve_model", "summarize", "summarize_model"]
