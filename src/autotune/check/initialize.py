"""What `deepspeed.initialize` refuses although DeepSpeed's config parser accepts it.

The parser never looks at `optimizer.type`, `scheduler.type` or their params; the engine does, when
it builds them (runtime/engine.py: `_do_args_sanity_check` asserts the optimizer name,
`_configure_basic_optimizer` maps the name to a class and calls it with the params,
`_do_optimizer_sanity_check` asserts zero_allow_untested_optimizer for optimizers ZeRO has not been
tested with, `_scheduler_from_config` asserts the scheduler name and calls it with the params).
The same decisions are made here with the installed DeepSpeed's own names and classes: schedulers and
torch optimizers are really constructed (on a one-element tensor, cheap), DeepSpeed's fused and CPU
optimizers are checked against their signature (constructing them would build a GPU or C++ op).
Every finding names the DeepSpeed version: the lists change between releases.
"""

from __future__ import annotations

import inspect
from typing import Any

from autotune.check.findings import Finding, Severity
from autotune.dsconfig.loading import section_of
from autotune.infra.environment import parse_without_device


def deepspeed_version() -> str:
    parse_without_device()  # the CPU accelerator, and DeepSpeed's import-time log kept off stdout (--json)
    import deepspeed

    return str(deepspeed.__version__)


def _offloads_optimizer(config: dict[str, Any]) -> bool:
    """DeepSpeedConfig.zero_config.offload_optimizer device cpu/nvme: the engine's zero_use_cpu_optimizer."""
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict) or not isinstance(zero.get("stage"), int) or zero.get("stage", 0) < 1:
        return False
    offload = zero.get("offload_optimizer")
    return isinstance(offload, dict) and offload.get("device") in ("cpu", "nvme")


def _optimizer_class(name: str, params: dict[str, Any], offload: bool) -> tuple[Any, set[str]]:
    """The class the engine builds for `name`, and the params the engine itself consumes first."""
    import torch
    from deepspeed.runtime import config as ds_config

    lowered = name.lower() if name.lower() in ds_config.DEEPSPEED_OPTIMIZERS else name
    if lowered in (ds_config.ADAM_OPTIMIZER, ds_config.ADAMW_OPTIMIZER):
        consumed = {"adam_w_mode", "torch_adam", "fp32_optimizer_states"}
        if params.get("torch_adam"):
            return torch.optim.AdamW, consumed | {"foreach"}
        if offload:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam, consumed
        from deepspeed.ops.adam import FusedAdam

        return FusedAdam, consumed
    if lowered == ds_config.ADAGRAD_OPTIMIZER:
        if offload:
            from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

            return DeepSpeedCPUAdagrad, set()
        return torch.optim.Adagrad, set()
    if lowered == ds_config.LAMB_OPTIMIZER:
        from deepspeed.ops.lamb import FusedLamb

        return FusedLamb, set()
    if lowered == ds_config.LION_OPTIMIZER:
        from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion

        return (DeepSpeedCPULion if offload else FusedLion), set()
    if lowered in ds_config.DEEPSPEED_OPTIMIZERS:
        return None, set()  # MuAdam/MuSGD (mup) and Muon: built from param groups; not checked further
    return getattr(torch.optim, lowered, None), set()


def _unexpected_params(cls: Any, params: dict[str, Any], consumed: set[str]) -> list[str]:
    signature = inspect.signature(cls)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
        return []
    return sorted(set(params) - consumed - set(signature.parameters))


def _construct_torch_optimizer(cls: Any, params: dict[str, Any]) -> str:
    import torch

    try:
        cls([torch.nn.Parameter(torch.zeros(1))], **params)
    except (TypeError, ValueError, RuntimeError) as error:
        return f"{type(error).__name__}: {error}"
    return ""


def _is_zero_supported(cls: Any) -> bool:
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    return cls in ZERO_SUPPORTED_OPTIMIZERS


def optimizer_findings(config: dict[str, Any], version: str) -> list[Finding]:
    """Checks on the config as DeepSpeed receives it ("auto" already filled by its consumer)."""
    section = config.get("optimizer")
    if not isinstance(section, dict) or not isinstance(section.get("type"), str):
        return []
    import torch
    from deepspeed.runtime import config as ds_config

    name = section["type"]
    params = section_of(section, "params")
    where = f"DeepSpeed {version}"
    if name.lower() not in ds_config.DEEPSPEED_OPTIMIZERS and getattr(torch.optim, name, None) is None:
        known = ", ".join(sorted({n.capitalize() for n in ds_config.DEEPSPEED_OPTIMIZERS} | {"AdamW", "SGD"}))
        message = (
            f"deepspeed.initialize asserts {name!r} is not a supported DeepSpeed Optimizer ({where}: "
            f"runtime/engine.py _do_args_sanity_check; accepted: {known} or any torch.optim class)."
        )
        if name.lower() in ("fusedadam", "cpuadam", "deepspeedcpuadam"):
            message += ' "Adam"/"AdamW" already selects FusedAdam on GPU and DeepSpeedCPUAdam with offload.'
        return [Finding(Severity.ERROR, "optimizer.type", message, "initialize")]
    findings: list[Finding] = []
    if "max_grad_norm" in params:
        message = f"deepspeed.initialize raises ValueError ({where}): use the top-level gradient_clipping instead."
        findings.append(Finding(Severity.ERROR, "optimizer.params.max_grad_norm", message, "initialize"))
        params = {k: v for k, v in params.items() if k != "max_grad_norm"}
    cls, consumed = _optimizer_class(name, params, _offloads_optimizer(config))
    if cls is None:
        return findings
    unexpected = _unexpected_params(cls, params, consumed)
    for key in unexpected:
        message = f"{cls.__name__} takes no {key!r}: deepspeed.initialize raises TypeError ({where})."
        findings.append(Finding(Severity.ERROR, f"optimizer.params.{key}", message, "initialize"))
    if not unexpected and cls.__module__.startswith("torch.optim") and "auto" not in params.values():
        problem = _construct_torch_optimizer(cls, {k: v for k, v in params.items() if k not in consumed})
        if problem:
            message = f"{cls.__name__} refuses these params at deepspeed.initialize: {problem}"
            findings.append(Finding(Severity.ERROR, "optimizer.params", message, "initialize"))
    zero = config.get("zero_optimization")
    stage = zero.get("stage", 0) if isinstance(zero, dict) else 0
    if (
        isinstance(stage, int)
        and stage > 0
        and not _is_zero_supported(cls)
        and not config.get("zero_allow_untested_optimizer")
    ):
        message = (
            f"ZeRO has not been tested with {cls.__name__}: deepspeed.initialize asserts unless "
            f'"zero_allow_untested_optimizer": true ({where}: runtime/zero/utils.py ZERO_SUPPORTED_OPTIMIZERS).'
        )
        findings.append(Finding(Severity.ERROR, "optimizer.type", message, "initialize"))
    return findings


def scheduler_findings(config: dict[str, Any], version: str) -> list[Finding]:
    """The scheduler is built for real on a one-parameter SGD optimizer: its own checks run."""
    section = config.get("scheduler")
    if not isinstance(section, dict) or not isinstance(section.get("type"), str):
        return []
    import torch
    from deepspeed.runtime import lr_schedules

    name = section["type"]
    params = section_of(section, "params")
    where = f"DeepSpeed {version}"
    cls = getattr(lr_schedules, name, None) or getattr(torch.optim.lr_scheduler, name, None)
    if not isinstance(cls, type):  # inspect.isclass's own test (None fails it too), which mypy narrows to a class
        message = (
            f"deepspeed.initialize asserts: DeepSpeed does not recognize LR scheduler {name!r} ({where}; accepted: "
            f"{', '.join(lr_schedules.VALID_LR_SCHEDULES)} or a torch.optim.lr_scheduler class)."
        )
        return [Finding(Severity.ERROR, "scheduler.type", message, "initialize")]
    if "auto" in params.values():
        return []  # reported by the "auto" checks
    from autotune.check.schema import deepspeed_log_captured

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.001)  # the scheduler sets its own lr
    try:
        with deepspeed_log_captured():  # its "lr before the scheduler started" warning is not for the user
            cls(optimizer, **params)
    except (TypeError, ValueError, AssertionError, ZeroDivisionError) as error:
        message = f"{name} refuses these params at deepspeed.initialize ({where}): {type(error).__name__}: {error}"
        return [Finding(Severity.ERROR, "scheduler.params", message, "initialize")]
    return []


def accelerate_maps_client_optimizer() -> bool:
    """Whether the installed accelerate swaps the script's torch optimizer for DeepSpeed's CPU one under optimizer
    offload: Accelerator._prepare_deepspeed calls map_pytorch_optim_to_deepspeed when offload_optimizer.device is
    not "none" and zero_force_ds_cpu_optimizer holds (accelerate/accelerator.py, imported there from
    accelerate/utils/deepspeed.py). The HF Trainer hands its optimizer to that same prepare()."""
    try:
        import accelerate.accelerator as accelerator_module
    except ImportError:
        return False
    return callable(getattr(accelerator_module, "map_pytorch_optim_to_deepspeed", None))


def _mapped_by_accelerate() -> Finding:
    """What the swap keeps, from accelerate's code: map_pytorch_optim_to_deepspeed (accelerate/utils/deepspeed.py)
    builds `DeepSpeedCPUAdam(optimizer.param_groups, lr=..., weight_decay=..., adamw_mode=...)`; the param groups
    are the script's own, with their lr, betas, eps and weight_decay, and DeepSpeedCPUAdam.step reads each group's
    (deepspeed/ops/adam/cpu_adam.py: group['betas'], group['eps']). torch's add_param_group only fills keys a group
    lacks, so a torch AdamW/Adam keeps everything; an optimizer without betas (SGD) gets DeepSpeedCPUAdam's.
    tests/test_check_offload_optimizer.py runs accelerate's mapping on a real optimizer to hold this."""
    from autotune.training.job_defaults import job_defaults

    defaults = job_defaults().adam_text().split(" (offloaded")[0]
    message = (
        "Optimizer offload without an \"optimizer\" section: accelerate's prepare() (the HF Trainer's too) "
        "replaces the script's torch optimizer by DeepSpeedCPUAdam built on its param groups"
        " (map_pytorch_optim_to_deepspeed): each group's lr, betas, eps and weight_decay carry over, and AdamW vs"
        " Adam; Adagrad runs as DeepSpeedCPUAdagrad; other optimizers (SGD, Adafactor) run as Adam, with"
        f" DeepSpeedCPUAdam's defaults for what their groups lack ({defaults})."
    )
    return Finding(Severity.INFO, "zero_optimization.offload_optimizer", message, "initialize")


def client_optimizer_findings(
    config: dict[str, Any], consumer_label: str, fills_auto: bool, version: str
) -> list[Finding]:
    """Optimizer offload with no "optimizer" section: the training code brings a torch optimizer.

    Through the HF Trainer or accelerate, accelerate maps it to DeepSpeedCPUAdam (accelerate_maps_client_optimizer),
    so it trains; a note says what of the optimizer carries over. Code calling DeepSpeed directly gets
    ZeRORuntimeException from deepspeed.initialize unless zero_force_ds_cpu_optimizer is false
    (runtime/engine.py _configure_optimizer; default true in runtime/config.py) or it passes DeepSpeedCPUAdam
    itself, which is accepted. Published reports of the crash: OptimalScale/LMFlow#470 and #693, OpenMOSS/MOSS#272
    (transformers/accelerate releases from before the mapping).
    """
    if "optimizer" in config or not _offloads_optimizer(config) or config.get("zero_force_ds_cpu_optimizer") is False:
        return []
    if fills_auto and accelerate_maps_client_optimizer():
        return [_mapped_by_accelerate()]
    from autotune.check.findings import Edit, Fix

    who = (
        f"{consumer_label} builds a torch optimizer when the config has none and this accelerate does not map it"
        if fills_auto
        else "unless your code passes deepspeed.ops.adam.DeepSpeedCPUAdam (or DeepSpeedCPULion)"
    )
    message = (
        f'Optimizer offload without an "optimizer" section: {who}, and deepspeed.initialize raises '
        f'ZeRORuntimeException ("ZeRO-Offload with a client provided optimizer", DeepSpeed {version}). '
        'An "optimizer" section (AdamW, params "auto") gives DeepSpeedCPUAdam, which is much faster.'
    )
    fix = Fix(
        'set "zero_force_ds_cpu_optimizer": false (same optimizer, stepped on the CPU; or add an optimizer section)',
        (Edit("set", ("zero_force_ds_cpu_optimizer",), False),),
        changes_training=False,
    )
    severity = Severity.ERROR if fills_auto else Severity.WARNING
    return [Finding(severity, "zero_optimization.offload_optimizer", message, "initialize", fix=fix)]
