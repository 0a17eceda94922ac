"""What one pin_memory() costs in host RAM on this machine's torch (run by kit.py's "pinned" stage, in a child).

The memory model counts each pinned offload tensor at the next power of two (src/autotune/estimate/pinned.py,
from torch's CachingHostAllocator source and others' measurements); this measures it: for each size, the growth
of the process's VmRSS and RssShmem (cudaHostAlloc'd pages) after `torch.empty(n, dtype=uint8).pin_memory()`,
and torch.cuda.host_memory_stats() where this torch has it. Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MiB = 2**20
SIZES = (257 * MiB, 1025 * MiB, 2304 * MiB)  # just above 256 MiB and 1 GiB (rounded to 2x), and 2.25 GiB


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def main() -> int:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from autotune.estimate.pinned import pinned_bytes

    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "needs CUDA: pin_memory() is a no-op on the CPU backend"}))
        return 0
    torch.cuda.init()
    rows, kept = [], []
    for size in SIZES:
        rss, shmem = _status_kib("VmRSS"), _status_kib("RssShmem")
        kept.append(torch.empty(size, dtype=torch.uint8).pin_memory())  # kept: a freed block would be reused
        grown_rss = (_status_kib("VmRSS") - rss) * 1024
        grown_shmem = (_status_kib("RssShmem") - shmem) * 1024
        rows.append(
            {
                "requested_bytes": size,
                "rss_growth_bytes": grown_rss,
                "rss_shmem_growth_bytes": grown_shmem,
                "predicted_bytes": pinned_bytes(size, True),
            }
        )
    stats = getattr(torch.cuda, "host_memory_stats", None)
    print(json.dumps({"torch": torch.__version__, "rows": rows, "host_memory_stats": stats() if stats else None}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
