"""Values that parse but do not mean what they say: leftover "auto", numbers written as strings.

Where DeepSpeed meets such a value decides the severity:
- batch keys: DeepSpeedConfig does arithmetic on them and raises TypeError at once;
- gradient_clipping, optimizer.params, scheduler.params: handed on untouched, so training fails at
  initialize or at the first step;
- fields of pydantic sections: "auto" is dropped (the default is used without a word), strings are
  coerced or refused by pydantic;
- anything else: DeepSpeed uses the string as it is.
"""

from __future__ import annotations

import enum
import inspect
import re
import types
from collections.abc import Iterator
from typing import Any, Union, get_args, get_origin

from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from autotune.check import schema
from autotune.check.findings import ConfigPath, Edit, Finding, Fix, Severity, dotted

_NUMBER = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$")
_BOOLEAN = ("true", "false")


def batch_keys() -> tuple[str, str, str]:
    from deepspeed.runtime.constants import (
        GRADIENT_ACCUMULATION_STEPS,
        TRAIN_BATCH_SIZE,
        TRAIN_MICRO_BATCH_SIZE_PER_GPU,
    )

    return TRAIN_BATCH_SIZE, TRAIN_MICRO_BATCH_SIZE_PER_GPU, GRADIENT_ACCUMULATION_STEPS


def _leaves(config: dict[str, Any], prefix: ConfigPath = ()) -> Iterator[tuple[ConfigPath, Any]]:
    for key, value in config.items():
        path = (*prefix, key)
        if isinstance(value, dict):
            yield from _leaves(value, path)
        else:
            yield path, value


def _handed_to_constructor(path: ConfigPath) -> bool:
    """optimizer.params.* and scheduler.params.* go straight into the optimizer / scheduler class."""
    from deepspeed.runtime.constants import OPTIMIZER, OPTIMIZER_PARAMS, SCHEDULER, SCHEDULER_PARAMS

    return len(path) == 3 and (path[0], path[1]) in ((OPTIMIZER, OPTIMIZER_PARAMS), (SCHEDULER, SCHEDULER_PARAMS))


def _fails_late(path: ConfigPath) -> str | None:
    """How DeepSpeed fails on a non-number here, or None where it does not fail."""
    from deepspeed.runtime.constants import GRADIENT_CLIPPING, STEPS_PER_PRINT

    if path in [(key,) for key in batch_keys()]:
        return "DeepSpeedConfig raises TypeError when it derives the batch sizes"
    if path == (GRADIENT_CLIPPING,):
        return "deepspeed.initialize accepts it, then the first step() raises TypeError"
    if path == (STEPS_PER_PRINT,):
        return "the first step() raises TypeError (engine: global_steps % steps_per_print)"
    if _handed_to_constructor(path):
        return f"it is passed as is to the {path[0]} class, which fails at initialize or at the first step"
    return None


def _constructor_defaults(config: dict[str, Any], section: str) -> dict[str, Any]:
    """Keyword defaults of the class DeepSpeed builds for `optimizer` or `scheduler` (empty when unknown)."""
    import torch

    type_name = str(config.get(section, {}).get("type", ""))
    params = config.get(section, {}).get("params", {})
    cls: Any = None
    if section == "optimizer":
        # engine.get_optimizer_configuration: FusedAdam on GPU, torch's AdamW/Adam when torch_adam is set
        if type_name.lower() in ("adam", "adamw") and params.get("torch_adam"):
            cls = torch.optim.AdamW if params.get("adam_w_mode", True) else torch.optim.Adam
        elif type_name.lower() in ("adam", "adamw"):
            from deepspeed.ops.adam import FusedAdam

            cls = FusedAdam
        else:
            cls = next((getattr(torch.optim, n) for n in dir(torch.optim) if n.lower() == type_name.lower()), None)
    else:
        from deepspeed.runtime import lr_schedules

        cls = getattr(lr_schedules, type_name, None) if type_name in lr_schedules.VALID_LR_SCHEDULES else None
    if cls is None:
        return {}
    return {
        name: parameter.default
        for name, parameter in inspect.signature(cls).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }


def _json_value(value: Any) -> Any:
    """Plain JSON types: DeepSpeed's defaults may be enums or pp_int (an int that prints with commas)."""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    return value


def _shown(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return repr(value)


def _auto_fix(config: dict[str, Any], path: ConfigPath, field: FieldInfo | None) -> Fix | None:
    from deepspeed.runtime.constants import GRADIENT_CLIPPING, GRADIENT_CLIPPING_DEFAULT

    if path == (GRADIENT_CLIPPING,):
        return Fix(
            f"set DeepSpeed's default {GRADIENT_CLIPPING_DEFAULT}",
            (Edit("set", path, GRADIENT_CLIPPING_DEFAULT),),
            changes_training=True,
        )
    if path in [(key,) for key in batch_keys()]:
        return _batch_auto_fix(config, path)
    if _handed_to_constructor(path):
        defaults = _constructor_defaults(config, path[0])
        if path[2] in defaults:
            default = _json_value(defaults[path[2]])
            return Fix(f"set the {path[0]}'s default {_shown(default)}", (Edit("set", path, default),), True)
        if path[0] == "optimizer":
            return Fix("remove it, so the optimizer's own default applies", (Edit("remove", path),), True)
        return None  # a scheduler argument without a default: only the user knows it
    if field is not None:
        default = _json_value(schema.field_default(field))
        if isinstance(default, (bool, int, float, str)):
            return Fix(f"set DeepSpeed's default {_shown(default)}", (Edit("set", path, default),))
    return Fix("remove it, so DeepSpeed's default applies", (Edit("remove", path),))


def _batch_auto_fix(config: dict[str, Any], path: ConfigPath) -> Fix:
    """Drop "auto" batch keys so DeepSpeed derives them; keep at least a micro-batch of 1."""
    train_batch, micro_batch, _ = batch_keys()
    concrete = [key for key in (train_batch, micro_batch) if isinstance(config.get(key), int)]
    if not concrete and path == (micro_batch,):
        return Fix("set 1 (nothing else fixes the batch size; review it)", (Edit("set", path, 1),), True)
    return Fix("remove it, so DeepSpeed derives it from the other batch keys", (Edit("remove", path),), True)


def auto_findings(config: dict[str, Any]) -> list[Finding]:
    """Leftover "auto" from HF Trainer templates, where no HF Trainer will fill it."""
    findings: list[Finding] = []
    for path, value in _leaves(config):
        if value != "auto":
            continue
        field = schema.field_at(path)
        failure = _fails_late(path)
        if failure:
            severity, reason = Severity.ERROR, failure
        elif field is not None:
            default = _json_value(schema.field_default(field))
            severity, reason = Severity.WARNING, f"DeepSpeed drops it silently and uses its default {_shown(default)}"
        elif schema.model_at(path[:-1]) is not None:
            continue  # an unknown key of a pydantic section: reported as such
        else:
            severity, reason = Severity.WARNING, 'DeepSpeed uses the string "auto" as the value'
        message = f'"auto" is only filled in by the HF Trainer (pass --hf if this config is for it): {reason}.'
        findings.append(Finding(severity, dotted(path), message, "auto", fix=_auto_fix(config, path, field)))
    return findings


def _scalar_type(field: FieldInfo | None) -> type | None:
    """int, float or bool when the field holds one of those (Optional unwrapped); else None."""
    if field is None:
        return None
    annotation = field.annotation
    options = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    for option in options:
        if option is bool:
            return bool
        if isinstance(option, type) and issubclass(option, (int, float)):
            return float if issubclass(option, float) else int
    return None


def _converted(text: str, wanted: type | None) -> bool | int | float:
    if text.strip().lower() in _BOOLEAN:
        return text.strip().lower() == "true"
    number = float(text)
    if wanted is float:
        return number
    if wanted is int or (number.is_integer() and "." not in text):
        return int(number) if number.is_integer() else number
    return number


def string_value_findings(config: dict[str, Any]) -> list[Finding]:
    """Numbers and booleans written as strings, such as "1e9" or "false"."""
    findings: list[Finding] = []
    for path, value in _leaves(config):
        if not isinstance(value, str) or not (_NUMBER.match(value) or value.strip().lower() in _BOOLEAN):
            continue
        field = schema.field_at(path)
        wanted = _scalar_type(field)
        if field is not None and wanted is None:
            continue  # a string field (a path, a name): a string is right
        if field is None and schema.model_at(path[:-1]) is not None:
            continue  # an unknown key of a pydantic section: reported as such
        converted = _converted(value, wanted)
        failure = _fails_late(path)
        if failure:
            severity, reason = Severity.ERROR, failure
        elif field is not None:
            try:
                # FieldInfo.annotation is None for an unannotated field, which pydantic validates as Any
                annotation: Any = field.annotation
                TypeAdapter(Any if annotation is None else annotation).validate_python(value)
                severity, reason = Severity.INFO, "pydantic converts it, but a number is clearer"
            except ValidationError:
                severity, reason = Severity.ERROR, "DeepSpeed refuses it (pydantic cannot parse the string)"
        else:
            severity, reason = Severity.WARNING, "DeepSpeed uses the string as is (a non-empty string is true)"
        # Where pydantic coerces it or DeepSpeed fails on it, the number is what the user meant and changes
        # nothing that runs; where DeepSpeed uses the string as is, it may (a non-empty "false" is true).
        same_meaning = False if (field is not None or failure) else None
        fix = Fix(f"write {converted!r} (the same value, as a number)", (Edit("set", path, converted),), same_meaning)
        findings.append(Finding(severity, dotted(path), f"{value!r} is a string: {reason}.", "string-value", fix=fix))
    return findings
