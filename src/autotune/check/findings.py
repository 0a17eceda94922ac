"""What `autotune check` reports: findings, the edits that fix them, and the whole report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

ConfigPath = tuple[str, ...]


class Severity(str, Enum):
    ERROR = "error"  # DeepSpeed refuses the config, or crashes on it later
    WARNING = "warning"  # it runs, but not the way the config reads
    INFO = "info"  # worth knowing; nothing is wrong


@dataclass(frozen=True)
class Edit:
    """One change to the config: set a value, remove a key, or move a key elsewhere."""

    op: str  # "set" | "remove" | "move"
    path: ConfigPath
    value: Any = None  # for "set"
    to: ConfigPath = ()  # for "move"


@dataclass(frozen=True)
class Fix:
    description: str  # what --fix does, as shown in the table
    edits: tuple[Edit, ...] = ()
    # sets a training value (batch, lr, optimizer, precision): applied only with --fix-training.
    # None: decided from the edits (a set or move onto a training key).
    changes_training: bool | None = None


@dataclass(frozen=True)
class Finding:
    severity: Severity
    path: str  # dotted key path ("zero_optimization.offload_param"), "$NAME" for env vars, "" for the whole config
    message: str
    rule: str  # which check produced it: unknown-key, no-effect, batch, auto, string-value, precision, ...
    fix: Fix | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "severity": self.severity.value,
            "path": self.path,
            "message": self.message,
            "rule": self.rule,
            "fix": self.fix.description if self.fix else None,
        }


@dataclass(frozen=True)
class FitResult:
    """The predicted per-GPU peak of the config as written, on the target hardware."""

    candidate: str
    gpu_peak_bytes: int
    fits: bool
    reason: str
    target: str
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FixResult:
    """What --fix did: the changes made, whether DeepSpeed accepts the result, what is left."""

    output_path: str
    changes: tuple[str, ...]  # each applied change, with its reason
    written: bool
    rejected_by_deepspeed: str = ""  # DeepSpeed's (or the consumer's) message when the fixed config is still refused
    remaining: tuple[Finding, ...] = ()
    withheld: tuple[str, ...] = ()  # fixes not applied because they change training (need --fix-training)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["remaining"] = [finding.to_dict() for finding in self.remaining]
        return data


@dataclass
class CheckReport:
    config_path: str
    world_size: int
    world_size_source: str  # how the world size was decided, for the reader
    deepspeed_version: str = ""  # every finding is about this installed DeepSpeed
    consumer: str = "deepspeed"
    consumer_reason: str = ""  # one line: which consumer was assumed, and why
    findings: list[Finding] = field(default_factory=list)
    fit: FitResult | None = None
    fix: FixResult | None = None

    def count(self, severity: Severity) -> int:
        return sum(1 for finding in self.findings if finding.severity is severity)

    @property
    def has_errors(self) -> bool:
        return self.count(Severity.ERROR) > 0

    def exit_code(self) -> int:
        """1 when errors remain: in the written config with --fix (like a linter's --fix), else in the input."""
        if self.fix is not None:
            if not self.fix.written:
                return 1  # --fix wrote nothing: a script must not take an old output file for the fix
            return 1 if any(f.severity is Severity.ERROR for f in self.fix.remaining) else 0
        return 1 if self.has_errors else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config_path,
            "world_size": self.world_size,
            "world_size_source": self.world_size_source,
            "deepspeed_version": self.deepspeed_version,
            "consumer": self.consumer,
            "consumer_reason": self.consumer_reason,
            "counts": {severity.value: self.count(severity) for severity in Severity},
            "findings": [finding.to_dict() for finding in self.findings],
            "fit": self.fit.to_dict() if self.fit else None,
            "fix": self.fix.to_dict() if self.fix else None,
        }


TRAINING_KEYS = frozenset(
    {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "optimizer",
        "scheduler",
        "fp16",
        "bf16",
        "bfloat16",
    }
)


def touches_training(path: ConfigPath) -> bool:
    """A path whose value decides what is trained: batch sizes, optimizer, schedule, precision, clipping."""
    return bool(path) and path[0] in TRAINING_KEYS


def is_comment_key(key: str) -> bool:
    """Keys people use for notes ("_comment", "__doc", "// note"): never renamed or dropped by --fix."""
    return key.startswith(("_", "#", "//")) or "comment" in key.lower()


def dotted(path: ConfigPath) -> str:
    return ".".join(path)
