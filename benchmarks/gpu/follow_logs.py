"""Copy every trial's log into one file of $OUT as it is written, so a lease cut off at any second still brings
back the logs of the stage then in flight (the device tool brings back files under $OUT only, at most 8).

    python3 benchmarks/gpu/follow_logs.py --watch SCRATCH --out OUT/trial-stream.txt [--period-s 2]

Polls the *.log files under --watch (the kit's trial directories, the tune's warm pool and fresh trials, the op
builds) and appends what each gained since the last poll, under a header naming the file. Stops on SIGTERM after
one last poll, or by itself once --out reaches --max-bytes (the device tool's limit per file is 16 MiB).
"""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path

MAX_BYTES = 12 * 2**20  # under the 16 MiB the device tool brings back per file, with room for the header lines


class Follower:
    """What was copied of each log so far (byte offsets), and the file it all goes to."""

    def __init__(self, watch: Path, out: Path, max_bytes: int = MAX_BYTES) -> None:
        self.watch, self.out, self.max_bytes = watch, out, max_bytes
        self.offsets: dict[Path, int] = {}
        self.last: Path | None = None

    def poll(self) -> bool:
        """Append what the logs gained; False once the output is full."""
        written = self.out.stat().st_size if self.out.exists() else 0
        with self.out.open("a", encoding="utf-8", errors="replace") as sink:
            for log in sorted(self.watch.rglob("*.log")):
                try:
                    size = log.stat().st_size
                    if size <= self.offsets.get(log, 0):
                        continue
                    with log.open("rb") as source:
                        source.seek(self.offsets.get(log, 0))
                        chunk = source.read(min(size - self.offsets.get(log, 0), self.max_bytes - written))
                except OSError:  # removed between listing and reading (a trial that ran fine)
                    continue
                if not chunk:
                    return False
                if log != self.last:
                    sink.write(f"\n===== {log.relative_to(self.watch)} (from byte {self.offsets.get(log, 0)})\n")
                    self.last = log
                sink.write(chunk.decode("utf-8", errors="replace"))
                sink.flush()
                self.offsets[log] = self.offsets.get(log, 0) + len(chunk)
                written += len(chunk)
        return written < self.max_bytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--watch", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--period-s", type=float, default=2.0)
    parser.add_argument("--max-bytes", type=int, default=MAX_BYTES)
    args = parser.parse_args(argv)
    follower = Follower(args.watch, args.out, args.max_bytes)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    while not stopping and follower.poll():
        time.sleep(args.period_s)
    follower.poll()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
