"""From one tuning, what each common launcher needs to train exactly as tuned.

Four paths, each complete (tests/test_launch_paths.py runs every one of them on the CPU backend):
- `deepspeed` launcher with a plain DeepSpeed script: `--deepspeed` is a flag and the config is
  `--deepspeed_config PATH` (deepspeed/__init__.py, `add_config_arguments`).
- torchrun with the same script. torchrun sets OMP_NUM_THREADS=1 when it starts several ranks
  (torch/distributed/run.py), which leaves DeepSpeed's OpenMP CPU Adam on one thread; the command
  restores the `deepspeed` launcher's rule, cores per node / ranks per node (deepspeed/launcher/launch.py).
- HF Trainer under the `deepspeed` launcher: the `.hf.json` plus TrainingArguments flags that match it.
  HF refuses a config whose concrete values differ from TrainingArguments
  (transformers/integrations/deepspeed.py, `trainer_config_process` / `fill_match`), so every tuned value is
  concrete in the file and stated again as a flag.
- `accelerate launch` with an accelerate config whose `deepspeed_config_file` is that `.hf.json`, running
  the same HF Trainer script with the same flags.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from autotune.core.choices import Device, Kernels, Precision
from autotune.infra.atomic import atomic_write_text
from autotune.training.optimizers import optimizer_kind


@dataclass(frozen=True)
class TunedRun:
    """What the launch commands must reproduce, read off the emitted config and the choice."""

    config_path: Path
    hf_config_path: Path
    accelerate_config_path: Path
    micro_batch: int
    accumulation: int
    precision: Precision
    grad_checkpointing: bool
    stage: int
    optimizer: str = "adamw"
    lora_rank: int | None = None
    kernels: Kernels = "stock"  # estimate/kernels.py: "liger" is HF's --use_liger_kernel
    gpus_per_node: int = 1
    nodes: int = 1
    script: str = "train.py"  # a plain DeepSpeed script (deepspeed and torchrun paths)
    hf_script: str = "train.py"  # an HF Trainer script (HF Trainer and accelerate paths)
    device: Device = "cuda"  # "cpu": DeepSpeed's CPU backend, which a launched process selects by DS_ACCELERATOR


@dataclass(frozen=True)
class LaunchCommands:
    deepspeed: str  # plain DeepSpeed script under the deepspeed launcher
    torchrun: str  # the same script under torchrun
    hf_trainer: str = ""  # HF Trainer script under the deepspeed launcher
    accelerate: str = ""  # HF Trainer script under accelerate launch
    hf_flags: str = ""  # the TrainingArguments flags that match the .hf.json

    def to_dict(self) -> dict:
        return asdict(self)


def script_flags(run: TunedRun) -> str:
    """Flags of the plain DeepSpeed example script (examples/train_deepspeed.py) beyond the config."""
    flags = []
    if run.grad_checkpointing:
        flags.append("--gradient_checkpointing")
    if optimizer_kind(run.optimizer).client_side:
        flags.append(f"--optimizer {run.optimizer}")
    if run.lora_rank:
        flags.append(f"--lora_rank {run.lora_rank}")
    return "".join(f" {flag}" for flag in flags)


def hf_trainer_flags(run: TunedRun) -> str:
    """TrainingArguments flags matching the .hf.json: micro-batch, accumulation, precision, checkpointing,
    and the optimizer when the config leaves it to HF (`--optim`). `--lora_rank` is the example script's."""
    flags = [
        f"--per_device_train_batch_size {run.micro_batch}",
        f"--gradient_accumulation_steps {run.accumulation}",
    ]
    if run.precision in ("bf16", "fp16"):
        flags.append(f"--{run.precision}")
    if run.grad_checkpointing:
        flags.append("--gradient_checkpointing")
    kind = optimizer_kind(run.optimizer)
    if kind.hf_optim:
        flags.append(f"--optim {kind.hf_optim}")
    if run.lora_rank:
        flags.append(f"--lora_rank {run.lora_rank}")
    if run.kernels == "liger":  # the kernels the prediction counted (transformers 5.23 trainer.py:1494-1495)
        flags.append("--use_liger_kernel")
    return " ".join(flags)


def accelerate_config_text(run: TunedRun) -> str:
    """An accelerate config (YAML) that hands DeepSpeed the .hf.json untouched.

    With `deepspeed_config_file`, accelerate refuses its own copies of DeepSpeed settings (mixed precision,
    accumulation, stage, offload: accelerate/utils/dataclasses.py, `_deepspeed_config_checks`), so none appear.
    """
    lines = [
        "# Written by autotune: every DeepSpeed setting lives in the config file below.",
        "compute_environment: LOCAL_MACHINE",
        "distributed_type: DEEPSPEED",
        "deepspeed_config:",
        f"  deepspeed_config_file: {run.hf_config_path.resolve()}",
        f"  zero3_init_flag: {'true' if run.stage == 3 else 'false'}",
    ]
    if run.nodes > 1:
        lines.append("  deepspeed_multinode_launcher: standard")
    lines += [
        "machine_rank: 0  # set per node with --machine_rank",
        f"num_machines: {run.nodes}",
        f"num_processes: {run.gpus_per_node * run.nodes}",
        "rdzv_backend: static",
        "same_network: true",
        "use_cpu: false",
    ]
    return "\n".join(lines) + "\n"


def write_accelerate_config(run: TunedRun) -> Path:
    return atomic_write_text(run.accelerate_config_path, accelerate_config_text(run))


# A port free on this node when the command runs: two jobs on one node would otherwise both take the launchers'
# default 29500 (deepspeed/launcher/constants.py TORCH_DISTRIBUTED_DEFAULT_PORT, accelerate's main_process_port).
FREE_PORT = "$(python3 -c 'import socket; s = socket.socket(); s.bind((\"\", 0)); print(s.getsockname()[1])')"


def launch_commands(run: TunedRun) -> LaunchCommands:
    """Every multi-rank line sets its port: on one node a free one (torchrun's --standalone rendezvous listens on
    localhost:0, torch 2.13 distributed/run.py:988-991, and the workers' MASTER_PORT is that store's port,
    elastic/agent/server/api.py:536; the others get FREE_PORT), across nodes $MASTER_PORT, which every node must be
    given alike."""
    gpus, nodes = run.gpus_per_node, run.nodes
    multi = f" --num_nodes {nodes} --hostfile hostfile" if nodes > 1 else ""
    port = "$MASTER_PORT" if nodes > 1 else FREE_PORT
    ds_port = f" --master_port {port}" if gpus * nodes > 1 else ""
    ds_launcher = f"deepspeed{multi}{ds_port} --num_gpus {gpus}"
    plain = f"{run.script} --deepspeed --deepspeed_config {run.config_path}{script_flags(run)}"
    threads = f"OMP_NUM_THREADS=$(( $(nproc) / {gpus} )) " if gpus > 1 else ""
    if nodes > 1:
        rendezvous = f" --nnodes {nodes} --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:$MASTER_PORT"
    else:
        rendezvous = " --standalone" if gpus > 1 else ""
    flags = hf_trainer_flags(run)
    machine = " --machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR" if nodes > 1 else ""
    machine += f" --main_process_port {port}" if gpus * nodes > 1 else ""
    env = accelerator_prefix(run.device)
    return LaunchCommands(
        deepspeed=f"{env}{ds_launcher} {plain}",
        torchrun=f"{env}{threads}torchrun{rendezvous} --nproc-per-node {gpus} {plain}",
        hf_trainer=f"{env}{ds_launcher} {run.hf_script} --deepspeed {run.hf_config_path} {flags}",
        accelerate=f"{env}accelerate launch --config_file {run.accelerate_config_path}{machine}"
        f" {run.hf_script} {flags}",
        hf_flags=flags,
    )


def world_size_line(world_size: int, gpus_per_node: int, nodes: int) -> str:
    """What `tune` and `hook` say about the world size: DeepSpeed asserts train_batch_size == micro-batch x
    accumulation x ranks (deepspeed 0.19.8 runtime/config.py `_batch_assertion`), so the config holds for one."""
    return (
        f"valid for world size {world_size} ({gpus_per_node} rank(s) per node x {nodes} node(s)): DeepSpeed refuses"
        " it at another world size (train_batch_size = micro-batch x accumulation x ranks); tune again for"
        " another job shape"
    )


def accelerator_prefix(device: str) -> str:
    """`DS_ACCELERATOR=cpu ` for the CPU backend, which the tuning measured: without it DeepSpeed picks CUDA on
    any machine where torch sees a GPU (deepspeed 0.19.8 accelerator/real_accelerator.py:200-205), and falls
    back to the CPU only with a warning elsewhere."""
    return "DS_ACCELERATOR=cpu " if device == "cpu" else ""
