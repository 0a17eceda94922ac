"""The installed stack's versions, read in one place: the features that need a newer one than the floor, and the
DeepSpeed release autotune's facts about DeepSpeed were read in.

Why: autotune installs into the user's own training environment (pyproject's floors are measured:
benchmarks/results/version_floors.json), so a feature a newer release added is gated at run time with one line
("ZenFlow needs DeepSpeed >= 0.19.8; you have 0.17.6: not searched") instead of the package refusing to install.
Versions come from package metadata (importlib.metadata): no torch or DeepSpeed import.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

# The package's own version (pyproject.toml [project].version says the same); `autotune.__version__`.
AUTOTUNE_VERSION = "0.1.0"


def installed(package: str) -> str | None:
    """The installed distribution's version string, None when it is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """Parse "2.5.1+cu124" as (2, 5, 1) and "0.17.6rc1" as (0, 17, 6); None or unparsable gives None."""
    if not text:
        return None
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


# The DeepSpeed release autotune's facts about DeepSpeed were read in: the memory model's buffers and retention
# (estimate/), the modern modes (modes/applies.py), check's rules (check/), the trial's hooks (trial/). A source comment
# "deepspeed 0.19.8 runtime/zero/stage3.py:1105" cites a line of this release, and keeps the number: a line number
# holds for the release it was read in, so moving this constant to a newer release means re-reading those lines.
# A comment naming another release (0.17.6, 0.15.3) cites that one.
DEEPSPEED_READ_AGAINST = "0.19.8"


def read_against_note(have: str | None) -> str | None:
    """One line when the installed DeepSpeed (`have`) is not the release autotune's DeepSpeed facts were read in;
    None when it is, or when none is installed (a login node that only plans: nothing to compare)."""
    if have is None or version_tuple(have) == version_tuple(DEEPSPEED_READ_AGAINST):
        return None
    return (
        f"DeepSpeed {have} is installed; autotune's DeepSpeed facts (memory model, modes, config rules) were read in"
        f" {DEEPSPEED_READ_AGAINST} and may not hold where {have} differs"
    )


def deepspeed_note() -> str | None:
    """`read_against_note` for the DeepSpeed installed here."""
    return read_against_note(installed("deepspeed"))


@dataclass(frozen=True)
class FeatureFloor:
    """The first release of `package` that has `feature`, and where that was read."""

    feature: str
    package: str
    first: tuple[int, ...]
    source: str

    def missing(self, have: str | None) -> str | None:
        """One line when the installed `have` is older than the feature needs; None when it is new enough or
        unknown (not installed, e.g. a login-node install that only plans: the cluster's version decides)."""
        parsed = version_tuple(have)
        if parsed is None or parsed >= self.first:
            return None
        need = ".".join(map(str, self.first))
        return f"{self.feature} needs {self.package} >= {need}; you have {have}: not searched"


# Read in the released sdists: deepspeed/runtime/zenflow/ is absent in 0.17.4 and present in 0.17.5, but ZenFlow
# runs only from a later release: 0.17.6's engine refuses ZenFlow's CPU optimizer as an "untested ZeRO Optimizer"
# (zero/utils.py:43, engine.py:1384; seen at the declared floors), 0.19.8 accepts it (zero/utils.py:46); the releases
# between were not checked, so the floor is the one seen to work. The offload config's `super_offload` field and
# runtime/superoffload/ are absent in 0.17.6 and present in 0.18.0. DeepSpeed's config models forbid unknown keys,
# so an older release refuses a config that names either.
ZENFLOW = FeatureFloor(
    "ZenFlow", "DeepSpeed", (0, 19, 8), "0.17.6 refuses ZenFlow's optimizer as untested; 0.19.8 runs it"
)
SUPER_OFFLOAD = FeatureFloor(
    "SuperOffload", "DeepSpeed", (0, 18, 0), "deepspeed/runtime/superoffload/ first ships in 0.18.0"
)


def library_versions() -> dict[str, str]:
    """The versions a stored answer was measured with (a change makes it a cache miss)."""
    versions = {}
    for name in ("autotune", "torch", "deepspeed", "transformers"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "unknown"
    return versions
