"""The files every hook process leaves at its own --out: the same six `tune` writes, naming that --out.

The tuner works in a private staging directory (nothing reaches --out before the record says it may), so
the paths in what it wrote there die with it. It publishes what the files are made of instead (the
config, the chosen candidate, the report data, the picture) and every process, the tuner included, writes
them from the record: the config byte for byte, its `.hf.json` and `.accelerate.yaml`, the
`.autotune.json` that `autotune check` reads, and `autotune-report.{md,json,png}` in the report directory,
with every path and launch command pointing at this process's --out. Nothing here imports torch or
DeepSpeed: a cache hit stays a file read and a few writes.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import shlex
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.core.ladder import Candidate
from autotune.dsconfig.build_config import hf_variant
from autotune.dsconfig.emit import emit_launchers
from autotune.errors import MalformedReportError
from autotune.hook.env import JobEnv
from autotune.infra.atomic import atomic_write_bytes, atomic_write_json
from autotune.report.assumptions import assumptions_path
from autotune.report.data import OwnCommand, TuneReport
from autotune.report.markdown import REPORT_STEM, write_report

if TYPE_CHECKING:
    from autotune.hook.coordinate import HookRecord
    from autotune.request.tune_request import TuneRequest

log = logging.getLogger(__name__)


def published_outputs(
    candidate: Candidate | None, report: TuneReport | None, staged: Path, picture: Path | None
) -> dict:
    """What the tuner adds to its record so that any process can write the outputs (see the module doc)."""
    outputs: dict[str, Any] = {"staged_config": str(staged)}
    if candidate is not None:
        outputs["candidate"] = candidate.to_dict()
    if report is not None:
        outputs["report"] = report.to_json()
    if picture is not None and picture.is_file():
        outputs["picture_png"] = base64.b64encode(picture.read_bytes()).decode("ascii")
    return outputs


def write_outputs(
    record: HookRecord, tuning: TuneRequest, job: JobEnv, config_path: Path, report_dir: Path
) -> Path | None:
    """Write everything beside `config_path` (already written) and the report in `report_dir`; the report's
    path, or None when the record carries no report (a tuning cut short keeps only its config)."""
    config = json.loads(record.config_text or "{}")
    outputs = record.details.get("outputs") or {}
    hf_path = atomic_write_json(config_path.with_suffix(".hf.json"), hf_variant(config, _user_base(tuning)))
    if isinstance(record.details.get("assumptions"), dict):  # what `autotune check` reads beside the config
        atomic_write_json(assumptions_path(config_path), record.details["assumptions"])
    report = published_report(outputs)
    launch = None
    if outputs.get("candidate"):
        candidate = Candidate.from_dict(outputs["candidate"])
        launch = emit_launchers(
            config,
            candidate,
            config_path,
            job.gpus_per_node,
            nodes=job.nodes,
            script=tuning.training.script or "train.py",
            optimizer=tuning.training.optimizer,
            lora_rank=tuning.model.lora_rank,
            kernels=tuning.model.kernels,
            device=tuning.hardware.device,
            precision=report.precision if report else tuning.training.precision,  # the one tuned for
        )
    if report is None:
        return None
    picture = _picture(outputs)
    if picture is not None:
        atomic_write_bytes(report_dir / f"{REPORT_STEM}.png", picture)
    report = replace(report, config_path=str(config_path), hf_config_path=str(hf_path))
    if launch is not None:
        report = replace(report, launch=launch)
    if report.own_command and outputs.get("staged_config"):
        report = replace(report, own_command=_retarget(report.own_command, outputs["staged_config"], config_path))
    report_md, _ = write_report(report, report_dir, redraw=picture is None)
    return report_md


def _user_base(tuning: TuneRequest) -> dict[str, Any] | None:
    """The user's own config (--config, or the file an own command names): the .hf.json keeps its clipping and
    optimizer values as written, as `tune` writes it (dsconfig.build.hf_variant)."""
    from autotune.dsconfig.base_config import load_base

    if tuning.training.base_config is not None:
        return load_base(tuning.training.base_config)
    if tuning.training.command:
        from autotune.request.own_command_mode import command_base

        return command_base(tuning)
    return None


def published_report(outputs: dict) -> TuneReport | None:
    """The report a record carries, read back through its type; None when it carries none, or one this version
    cannot read (a record another autotune version wrote): then the config is written without its report."""
    if outputs.get("report") is None:
        return None
    try:
        return TuneReport.from_json(outputs["report"])
    except MalformedReportError as error:
        log.warning("autotune: the published report does not read back (%s); writing the config without it", error)
        return None


def _picture(outputs: dict) -> bytes | None:
    try:
        return base64.b64decode(outputs["picture_png"], validate=True) if outputs.get("picture_png") else None
    except (binascii.Error, TypeError):
        return None


def _retarget(own: OwnCommand, staged: str, config_path: Path) -> OwnCommand:
    """Own-command mode: the printed command names the staged config (a path no other text contains: a fresh
    private directory); name --out instead, quoted as the shell needs it."""
    command = own.train_command
    for staged_path, target_path in ((Path(staged).with_suffix(".hf.json"), config_path.with_suffix(".hf.json")),
                                     (Path(staged), config_path)):  # fmt: skip
        before, after = str(staged_path), str(target_path)
        if shlex.quote(after) != after:
            before, after = shlex.quote(before), shlex.quote(after)
        command = command.replace(before, after)
    return replace(own, train_command=command)
