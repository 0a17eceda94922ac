"""Settings that DeepSpeed accepts but that do not do what they say at this stage, batch size or GPU.

The stage facts below were read in DeepSpeed 0.19.8 (runtime/engine.py `_configure_zero_optimizer`,
runtime/zero/stage_1_and_2.py) and confirmed by running the engine on CPU (tests/test_check_engine.py).
"""

from __future__ import annotations

from typing import Any

from autotune.check import schema
from autotune.check.findings import Edit, Finding, Fix, Severity
from autotune.check.values import batch_keys
from autotune.core.units import format_bytes
from autotune.dsconfig.loading import section_of

ZERO = "zero_optimization"


def zero_stage(config: dict[str, Any]) -> int | None:
    """The ZeRO stage DeepSpeed will run, or None when the config does not say it as a number."""
    zero = config.get(ZERO, {})
    if not isinstance(zero, dict):
        return None
    stage = zero.get("stage", schema.field_default(schema.section_models()[ZERO].model_fields["stage"]))
    if isinstance(stage, bool) or not isinstance(stage, int):
        return None
    return stage


def _stage3_only_keys() -> set[str]:
    """Spellings of the zero fields used only by the stage-3 optimizer: the `stage3_*` aliases,
    their plain names, and sub_group_size (passed only to DeepSpeedZeroOptimizer_Stage3)."""
    keys = {"sub_group_size"}
    for name, field in schema.section_models()[ZERO].model_fields.items():
        if (field.alias or "").startswith("stage3_") or name.startswith("stage3_"):
            keys.update(key for key in (name, field.alias) if key is not None)
    return keys


def _no_effect(path: str, message: str, severity: Severity = Severity.WARNING) -> Finding:
    keys = tuple(path.split("."))
    return Finding(severity, path, message, "no-effect", fix=Fix("remove it", (Edit("remove", keys),)))


def stage_findings(config: dict[str, Any]) -> list[Finding]:
    zero = config.get(ZERO)
    stage = zero_stage(config)
    if not isinstance(zero, dict) or stage is None:
        return []
    findings: list[Finding] = []
    offload_param = zero.get("offload_param")
    if stage < 3 and isinstance(offload_param, dict) and offload_param.get("device", "none") != "none":
        findings.append(
            _no_effect(
                f"{ZERO}.offload_param",
                f"Ignored at stage {stage}: only the stage-3 optimizer offloads parameters, so they stay on the GPU.",
            )
        )
    if stage < 3:
        for key in sorted(set(zero) & _stage3_only_keys()):
            findings.append(_no_effect(f"{ZERO}.{key}", f"Has no effect at stage {stage}: only stage 3 reads it."))
    if stage not in (1, 2) and "round_robin_gradients" in zero:
        findings.append(
            _no_effect(f"{ZERO}.round_robin_gradients", f"Has no effect at stage {stage}: only stages 1 and 2 read it.")
        )
    if "allgather_partitions" in zero:
        message = "Parsed but read by nothing in DeepSpeed, at any stage."
        findings.append(_no_effect(f"{ZERO}.allgather_partitions", message, Severity.INFO))
    offload_optimizer = zero.get("offload_optimizer")
    if stage < 3 and isinstance(offload_optimizer, dict) and offload_optimizer.get("device") == "nvme":
        findings.append(_nvme_below_stage3(stage, offload_optimizer))
    return findings


def _nvme_below_stage3(stage: int, offload_optimizer: dict[str, Any]) -> Finding:
    """Policy: say "cpu", since that is what runs; moving to stage 3 would change far more than the user asked."""
    edits = [Edit("set", (ZERO, "offload_optimizer", "device"), "cpu")]
    if "nvme_path" in offload_optimizer:
        edits.append(Edit("remove", (ZERO, "offload_optimizer", "nvme_path")))
    return Finding(
        Severity.WARNING,
        f"{ZERO}.offload_optimizer.device",
        f"NVMe optimizer offload needs stage 3; at stage {stage} DeepSpeed keeps the optimizer states in CPU RAM "
        "and never touches the NVMe path. Plan host RAM for them, or use stage 3 for NVMe.",
        "no-effect",
        fix=Fix('write device "cpu" (what runs); use stage 3 yourself if you need NVMe', tuple(edits)),
    )


def activation_checkpointing_findings(config: dict[str, Any]) -> list[Finding]:
    if not isinstance(config.get("activation_checkpointing"), dict):
        return []
    message = (
        "The engine never applies this section: it acts only when the model code calls "
        "deepspeed.checkpointing.checkpoint. HF models use model.gradient_checkpointing_enable() instead."
    )
    return [Finding(Severity.INFO, "activation_checkpointing", message, "no-effect")]


def resolve_batch(
    train_batch: int | None, micro_batch: int | None, accumulation: int | None, world_size: int
) -> tuple[int | None, int | None, int | None, str]:
    """DeepSpeed's own derivation (DeepSpeedConfig._configure_train_batch_size); "" when it holds."""
    from deepspeed.runtime.config import DeepSpeedConfig

    resolver = DeepSpeedConfig.__new__(DeepSpeedConfig)  # only the batch attributes, no parse
    resolver.world_size = world_size
    resolver.train_batch_size = train_batch
    resolver.train_micro_batch_size_per_gpu = micro_batch
    resolver.gradient_accumulation_steps = accumulation
    try:
        resolver._configure_train_batch_size()
        problem = ""
    except AssertionError as error:
        problem = str(error)
    return (
        resolver.train_batch_size,
        resolver.train_micro_batch_size_per_gpu,
        resolver.gradient_accumulation_steps,
        problem,
    )


def stated_batch(config: dict[str, Any]) -> tuple[int | None, int | None, int | None] | None:
    """(train_batch_size, micro-batch, accumulation) as the config states them, each an integer or unset; None
    when one is anything else ("auto", a string, a bool)."""
    values: list[int | None] = []
    for name in batch_keys():
        value = config.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return None
        values.append(value)
    train_batch, micro_batch, accumulation = values
    return train_batch, micro_batch, accumulation


def batch_arithmetic(
    train_batch: int | None, micro_batch: int | None, accumulation: int | None, world_size: int
) -> str:
    """Which part of train_batch_size = micro-batch x accumulation x world size fails, in the config's own numbers
    (the keys it leaves unset are derived by DeepSpeed from the others); "" when train_batch_size is unset."""
    tbs_key, micro_key, gas_key = batch_keys()
    if train_batch is None:
        return ""
    if micro_batch is not None and accumulation is not None:
        product = micro_batch * accumulation * world_size
        return (
            f"{tbs_key} {train_batch} != {micro_key} {micro_batch} x {gas_key} {accumulation} x world size "
            f"{world_size} = {product}"
        )
    stated = [(micro_key, micro_batch), (gas_key, accumulation)]
    factors = [f"{name} {value}" for name, value in stated if value is not None] + [f"world size {world_size}"]
    divisor = (micro_batch or accumulation or 1) * world_size
    unset = " and ".join(name for name, value in stated if value is None)
    return f"{tbs_key} {train_batch} is not a multiple of {' x '.join(factors)} = {divisor} ({unset} unset)"


def batch_findings(config: dict[str, Any], world_size: int) -> list[Finding]:
    """train_batch_size = micro-batch x gradient accumulation x world size, or DeepSpeed refuses to start."""
    names = batch_keys()
    given = stated_batch(config)
    if given is None:
        return []  # "auto" or strings: reported by the value checks
    _, micro_batch, accumulation, problem = resolve_batch(*given, world_size)
    if not problem:
        return []
    tbs_key, micro_key, _ = names
    if given[0] is None and given[1] is None:
        message = f"DeepSpeed needs {tbs_key} or {micro_key}: {problem}"
        return [Finding(Severity.ERROR, micro_key, message, "batch")]
    shown = ", ".join(f"{name}={'unset' if value is None else value}" for name, value in zip(names, given, strict=True))
    message = f"Batch sizes do not add up at world size {world_size} ({shown}); DeepSpeed refuses to start: {problem}"
    fix = _batch_fix(given, micro_batch, accumulation, world_size)
    return [Finding(Severity.ERROR, tbs_key, message, "batch", fix=fix)]


def _batch_fix(
    given: tuple[int | None, int | None, int | None], micro_batch: int | None, accumulation: int | None, world_size: int
) -> Fix:
    """Keep the global batch and the micro-batch when gradient accumulation can make them add up.

    Only that touches no training value: the effective batch and the per-GPU batch stay as written.
    Otherwise the global batch has to change, which is the user's call (--fix-training).
    """
    tbs_key, micro_key, gas_key = batch_keys()
    total, micro = given[0], given[1]
    if isinstance(total, int) and isinstance(micro, int) and micro > 0 and total % (micro * world_size) == 0:
        steps = total // (micro * world_size)
        if steps >= 1:
            edits: tuple[Edit, ...] = (Edit("set", (gas_key,), steps),)
            description = f"keep {tbs_key}={total} and {micro_key}={micro}, set {gas_key}={steps}"
            return Fix(description, edits, changes_training=False)
    micro = max(1, micro_batch or 1)  # as given, or as DeepSpeed derived it (0 when the batch is too small)
    steps = max(1, accumulation or 1)
    fixed_total = micro * steps * world_size
    edits = (
        Edit("set", (micro_key,), micro),
        Edit("set", (gas_key,), steps),
        Edit("set", (tbs_key,), fixed_total),
    )
    description = (
        f"keep {micro_key}={micro} and {gas_key}={steps}, set {tbs_key}={fixed_total} (changes the global batch)"
    )
    return Fix(description, edits, changes_training=True)


def precision_findings(config: dict[str, Any], bf16_capable: bool | None) -> list[Finding]:
    """fp16 where the GPU has bf16 (loss scaling and overflow risk for nothing), or bf16 where it has none."""
    if bf16_capable is None:
        return []
    fp16 = section_of(config, "fp16")
    bf16 = section_of(config, "bf16")
    if bf16_capable and fp16.get("enabled") is True:
        edits = (Edit("remove", ("fp16",)), Edit("set", ("bf16",), {**bf16, "enabled": True}))
        message = (
            "fp16 on a GPU with bf16: bf16 has fp32's range, so it needs no loss scaling and does not overflow; "
            "same memory and speed."
        )
        return [
            Finding(
                Severity.WARNING,
                "fp16.enabled",
                message,
                "precision",
                fix=Fix("switch to bf16", edits, changes_training=True),
            )
        ]
    if not bf16_capable and bf16.get("enabled") is True:
        edits = (Edit("remove", ("bf16",)), Edit("set", ("fp16",), {**fp16, "enabled": True}))
        message = "bf16 on a GPU without bf16 support: it is emulated (slow) or fails; use fp16 with loss scaling."
        return [
            Finding(
                Severity.WARNING,
                "bf16.enabled",
                message,
                "precision",
                fix=Fix("switch to fp16", edits, changes_training=True),
            )
        ]
    return []


def _element_bytes(config: dict[str, Any]) -> tuple[int, str]:
    for name in ("bf16", "fp16"):
        section = config.get(name)
        if isinstance(section, dict) and section.get("enabled") is True:
            return 2, name
    return 4, "fp32"


def bucket_findings(config: dict[str, Any]) -> list[Finding]:
    """Bucket sizes are element counts; say what they cost in bytes, for the buffers the stage allocates.

    Stage 0 builds no ZeRO optimizer, so neither bucket exists: gradients are all-reduced in the engine's own
    buffers of MEMORY_OPT_ALLREDUCE_SIZE elements (deepspeed 0.19.8 runtime/engine.py:151, allreduce_gradients
    3073-3095; `_do_optimizer_sanity_check` 2294-2325 picks no ZeRO wrapper when zero is off). Stage 3 passes
    reduce_bucket_size but no allgather_bucket_size to its optimizer (runtime/engine.py 2755-2764)."""
    zero = config.get(ZERO)
    stage = zero_stage(config)
    if not isinstance(zero, dict) or stage is None or stage == 0:
        return []
    size, dtype = _element_bytes(config)
    accepted = schema.model_keys(schema.section_models()[ZERO])
    findings: list[Finding] = []
    for key, value in zero.items():
        field = accepted.get(key)
        if field is None or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        name = next(n for n, f in schema.section_models()[ZERO].model_fields.items() if f is field)
        if not name.endswith("bucket_size") or (stage < 3 and key in _stage3_only_keys()):
            continue
        elements = int(value)
        message = f"{elements:,} elements, not bytes: {format_bytes(elements * size)} per buffer in {dtype}"
        overlap = zero.get("overlap_comm", stage == 3)
        if name == "reduce_bucket_size" and stage in (1, 2) and overlap:
            message += f"; overlap_comm keeps two, {format_bytes(2 * elements * size)}"
        if name == "allgather_bucket_size" and stage == 3:
            continue
        findings.append(Finding(Severity.INFO, f"{ZERO}.{key}", message + ".", "bucket-size"))
    return findings
