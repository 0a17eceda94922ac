"""`autotune model`: resolve a model and print its exact sizes from a meta-device build."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from autotune.cli.options import JsonOpt, TrustRemoteCodeOpt
from autotune.cli.output import console, print_json
from autotune.errors import UserError
from autotune.models import resolve_model, summarize
from autotune.models.profiles import model_profiles


def _list_profiles(as_json: bool) -> None:
    profiles = sorted(model_profiles().values(), key=lambda p: p.name)
    if as_json:
        print_json([{"name": p.name, "hf_id": p.hf_id, "description": p.description} for p in profiles])
        return
    table = Table(title="Built-in model profiles")
    table.add_column("name")
    table.add_column("hub id")
    table.add_column("description")
    for p in profiles:
        table.add_row(p.name, p.hf_id or "-", p.description)
    console().print(table)


def model_command(
    model: Annotated[
        str | None, typer.Argument(help="Profile name, local HF dir or config.json, or cached hub id.")
    ] = None,
    list_profiles: Annotated[bool, typer.Option("--list", help="List the built-in model profiles.")] = False,
    trust_remote_code: TrustRemoteCodeOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Summarise a model: parameters, largest layer, shape, family. No weights are downloaded."""
    if list_profiles:
        _list_profiles(as_json)
        return
    if not model:
        raise UserError("give a model, e.g. `autotune model t5-3b`, or --list")
    summary = summarize(resolve_model(model, trust_remote_code))
    if as_json:
        data = summary.to_dict()
        data.pop("config")
        print_json(data)
        return
    table = Table(title=f"{summary.name} ({summary.architecture}, {summary.origin})", show_header=False)
    rows = [
        ("family", summary.family),
        ("total parameters", f"{summary.total_params:,}"),
        ("trainable parameters", f"{summary.trainable_params:,}"),
        ("largest layer parameters", f"{summary.largest_layer_params:,}"),
        ("hidden size", str(summary.hidden_size)),
        (
            "layers",
            f"{summary.num_layers} encoder + {summary.num_decoder_layers} decoder"
            if summary.family == "encoder-decoder"
            else str(summary.num_layers),
        ),
        ("attention heads / KV heads", f"{summary.num_heads} / {summary.num_kv_heads} (head dim {summary.head_dim})"),
        ("intermediate size", str(summary.intermediate_size)),
        ("vocab", f"{summary.vocab_size:,}"),
        ("max positions", str(summary.max_positions) if summary.max_positions else "relative (none)"),
        ("tied embeddings", "yes" if summary.tied_embeddings else "no"),
        ("fingerprint", summary.fingerprint),
    ]
    for key, value in rows:
        table.add_row(key, value)
    console().print(table)


def register(app: typer.Typer) -> None:
    app.command("model")(model_command)
