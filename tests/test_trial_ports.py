"""A one-node trial rendezvouses on loopback: nothing it starts listens on other interfaces."""

from __future__ import annotations

import ipaddress
import threading

import psutil
from tests.fakes.trials import GENEROUS_TIMEOUT_S, cpu_ops_built, marked_env, survivors, tiny_spec  # noqa: F401

from autotune.trial import LocalLauncher, run_trial


def _listening(mark: str) -> set[tuple[str, int]]:
    addresses = set()
    for process in survivors(mark):
        try:
            connections = process.net_connections(kind="inet")
        except psutil.Error:
            continue
        addresses |= {(c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN}
    return addresses


def test_a_one_rank_trial_listens_on_loopback_only() -> None:
    mark, env = marked_env()
    seen: set[tuple[str, int]] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.update(_listening(mark))
            done.wait(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = run_trial(tiny_spec(timeout_s=GENEROUS_TIMEOUT_S), LocalLauncher(env=env, use_torchrun=False))
    finally:
        done.set()
        watcher.join()
    assert result.status == "ok", result.error
    assert seen, "the trial's rendezvous was never seen listening"
    assert all(ipaddress.ip_address(ip).is_loopback for ip, _ in seen), seen
    assert not survivors(mark)
