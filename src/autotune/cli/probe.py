"""`autotune probe`: what this machine offers for training."""

from __future__ import annotations

import typer
from rich.table import Table

from autotune.cli.options import JsonOpt, NvmePathOpt
from autotune.cli.output import console, print_json
from autotune.core.units import format_bytes
from autotune.hardware.machine_probe import probe


def probe_command(nvme_path: NvmePathOpt = None, as_json: JsonOpt = False) -> None:
    """Show free GPU memory per device, host RAM and cores, and NVMe space."""
    result = probe(nvme_path)
    if as_json:
        print_json(result.to_dict())
        return
    out = console()
    if result.gpus:
        table = Table(title=f"GPUs (driver {result.driver_version or '?'})")
        for column in ("#", "name", "total", "free", "cc", "bf16", "NVLink", "PCIe"):
            table.add_column(column)
        for gpu in result.gpus:
            pcie = f"gen{gpu.pcie_generation} x{gpu.pcie_width}" if gpu.pcie_generation else "-"
            table.add_row(
                str(gpu.index),
                gpu.name,
                format_bytes(gpu.total_bytes),
                format_bytes(gpu.free_bytes),
                gpu.compute_capability or "-",
                "yes" if gpu.bf16 else "no",
                str(gpu.nvlink_active_links) if gpu.nvlink_active_links is not None else "-",
                pcie,
            )
        out.print(table)
    else:
        out.print(
            "[bold]No GPU visible[/bold] on this machine "
            f"({'; '.join(result.notes) or 'no NVIDIA driver'}). Plan with --gpu-type, or tune with --device cpu."
        )
    host = result.host
    out.print(
        f"Host: {format_bytes(host.ram_available_bytes)} RAM available of {format_bytes(host.ram_total_bytes)}, "
        f"{host.cpu_cores_logical} logical cores ({host.cpu_cores_physical or '?'} physical)"
    )
    if result.cuda_visible_devices is not None:
        out.print(f"CUDA_VISIBLE_DEVICES={result.cuda_visible_devices}")
    if host.nvme_path:
        out.print(f"NVMe: {format_bytes(host.nvme_free_bytes)} free at {host.nvme_path}")


def register(app: typer.Typer) -> None:
    app.command("probe")(probe_command)
