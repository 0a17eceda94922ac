"""A shared cache we can trust and survive: planted records refused, every corruption skipped or rebuilt.

Planting a file "from another user" needs root (os.chown to uid 65534); those tests skip otherwise.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import stat
from pathlib import Path

import pytest
from tests.test_hook_run import TUNED, FakeTune, hook_request
from tests.test_tune import CountingLauncher, tune_request

from autotune import tune
from autotune.atomic import atomic_write_text
from autotune.cache import ResultsCache
from autotune.hook import run_hook
from autotune.hook.coordinate import HookRecord, SharedSlot, coordinate, publish, read_record
from autotune.ladder import Candidate, Rung
from autotune.sharing import distrust_reason
from autotune.trial.types import RankMetrics, TrialResult

OTHER = 65534  # nobody / nogroup
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's file needs root (os.chown)")
GOOD = TrialResult("ok", ranks=[RankMetrics(0, host_rss_peak_bytes=2**20)], step_times_s=[0.1] * 3, samples_per_s=80.0)
MB8 = Candidate(Rung.Z0, 8, False)


def planted(key: str, config: dict) -> HookRecord:
    """The issue's attack: a well-formed, correctly checksummed record of the planter's choosing."""
    return HookRecord(key, "complete", json.dumps(config), "tuned", True, None, "cpu x86_64 budget 1GiB", "x", 0.0)


@as_root
def test_a_record_planted_by_another_user_is_refused_and_tuned_again(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)  # the world-writable directory the issue shared through
    first = run_hook(hook_request(tmp_path / "a.json", shared), environ={}, tune_fn=FakeTune())
    slot = SharedSlot(shared / "hook", first.key)
    evil = {"zero_optimization": {"stage": 2}, "train_batch_size": 7, "tensorboard": {"output_path": "/tmp/x"}}
    publish(slot, planted(first.key, evil))
    os.chown(slot.record_path, OTHER, OTHER)

    fake = FakeTune()
    result = run_hook(hook_request(tmp_path / "b.json", shared), environ={}, tune_fn=fake)
    assert result.role == "leader" and len(fake.requests) == 1
    assert "owned by uid 65534" in (result.ignored or "")
    assert json.loads(result.config_path.read_text()) == TUNED
    assert os.stat(slot.record_path).st_uid == os.geteuid()  # replaced by ours


def test_a_record_whose_config_deepspeed_rejects_is_not_written(tmp_path: Path) -> None:
    first = run_hook(hook_request(tmp_path / "a.json", tmp_path / "s"), environ={}, tune_fn=FakeTune())
    slot = SharedSlot(tmp_path / "s" / "hook", first.key)
    publish(slot, planted(first.key, {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 9}}))
    fake = FakeTune()
    result = run_hook(hook_request(tmp_path / "b.json", tmp_path / "s"), environ={}, tune_fn=fake)
    assert result.role == "leader" and len(fake.requests) == 1
    assert "DeepSpeed rejects its config at world size 1" in (result.ignored or "")
    assert json.loads(result.config_path.read_text()) == TUNED


@pytest.mark.parametrize(
    "body_change",
    [{"status": "done"}, {"verified": "yes"}, {"details": []}, {"created": "today"}],
    ids=["status", "verified", "details", "created"],
)
def test_a_checksummed_record_of_the_wrong_shape_is_ignored(tmp_path: Path, body_change: dict) -> None:
    slot = SharedSlot(tmp_path, "k1")
    body = {**planted("k1", TUNED).to_dict(), **body_change}
    from autotune.hook.coordinate import RECORD_FORMAT, record_digest

    record_file = {"format": RECORD_FORMAT, "record": body, "sha256": record_digest(body)}
    atomic_write_text(slot.record_path, json.dumps(record_file))
    record, why = read_record(slot)
    assert record is None and why and why.startswith("malformed")


def test_a_symlinked_record_is_not_followed(tmp_path: Path) -> None:
    elsewhere = SharedSlot(tmp_path / "elsewhere", "k1")
    publish(elsewhere, planted("k1", TUNED))
    slot = SharedSlot(tmp_path / "hook", "k1")
    slot.directory.mkdir()
    slot.record_path.symlink_to(elsewhere.record_path)
    record, why = read_record(slot)
    assert record is None and why and why.startswith("unreadable")


@as_root
def test_a_results_database_owned_by_another_user_is_neither_read_nor_written(tmp_path: Path, caplog) -> None:
    path = tmp_path / "results.sqlite"
    forged = TrialResult("ok", step_times_s=[1e-9] * 3, samples_per_s=1e9)
    ResultsCache(path).put_trial("k", MB8, forged)
    os.chown(path, OTHER, OTHER)
    with caplog.at_level(logging.WARNING):
        cache = ResultsCache(path)
        assert cache.trials("k") == {}
        cache.put_trial("k", MB8, GOOD)
    assert "owned by uid 65534" in (cache.untrusted or "") and "measured again" in caplog.text
    os.chown(path, os.geteuid(), os.getegid())
    assert ResultsCache(path).trials("k") == {MB8: forged}  # untouched: nothing was written while untrusted


@as_root
def test_group_sharing_through_a_setgid_directory_without_world_write(tmp_path: Path) -> None:
    shared = tmp_path / "group"
    shared.mkdir()
    os.chown(shared, os.geteuid(), OTHER)
    os.chmod(shared, 0o2770)
    cache = ResultsCache(shared / "results.sqlite")
    cache.put_trial("k", MB8, GOOD)
    written = atomic_write_text(shared / "hook" / "k.json", "{}")
    coordinate(SharedSlot(shared / "hook", "k2"), lambda r: True, lambda: planted("k2", TUNED), wait_timeout_s=5)
    for path, mode in [
        (cache.path, 0o664),
        (written, 0o664),
        (shared / "hook" / "k2.lock", 0o664),
        (shared / "hook", 0o2775),
    ]:
        info = os.stat(path)
        assert (stat.S_IMODE(info.st_mode), info.st_gid) == (mode, OTHER), path
    # a group member's file is trusted; the same file outside a shared-group directory is not
    os.chown(cache.path, OTHER, OTHER)
    assert ResultsCache(cache.path).trials("k") == {MB8: GOOD}
    plain = tmp_path / "plain"
    plain.mkdir()
    assert "owned by uid 65534" in (distrust_reason(os.stat(cache.path), plain) or "")
    os.chmod(cache.path, 0o666)
    assert distrust_reason(os.stat(cache.path), shared) == "writable by every user"


def _filled_database(path: Path) -> None:
    cache = ResultsCache(path)
    for mb in range(1, 200):
        cache.put_trial("k", Candidate(Rung.Z0, mb, False), GOOD)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty-header"])
def test_a_corrupt_database_is_moved_aside_and_rebuilt(tmp_path: Path, damage: str, caplog) -> None:
    path = tmp_path / "results.sqlite"
    _filled_database(path)
    size = path.stat().st_size
    if damage == "truncated":
        os.truncate(path, size // 2)
    elif damage == "garbage":
        path.write_bytes(os.urandom(size))
    else:
        path.write_bytes(b"\0" * 100)
    with caplog.at_level(logging.WARNING):
        cache = ResultsCache(path)
        assert cache.trials("k") == {}
    assert "is corrupt" in caplog.text
    assert len(list(tmp_path.glob("results.sqlite.corrupt-*"))) == 1
    cache.put_trial("k", MB8, GOOD)
    assert ResultsCache(path).trials("k") == {MB8: GOOD}


def test_a_database_corrupted_while_in_use_is_rebuilt_at_the_next_read(tmp_path: Path, caplog) -> None:
    path = tmp_path / "results.sqlite"
    cache = ResultsCache(path)
    path.write_bytes(b"this is not a database" * 300)
    with caplog.at_level(logging.WARNING):
        assert cache.trials("k") == {} and cache.recommendation("k") is None
    cache.put_trial("k", MB8, GOOD)
    assert cache.trials("k") == {MB8: GOOD}


ROWS = {
    "list": "[]",
    "null": "null",
    "speed-string": json.dumps({**GOOD.to_dict(), "samples_per_s": "1000000000"}),
    "status-unknown": json.dumps({**GOOD.to_dict(), "status": "great"}),
    "ok-without-speed": json.dumps({**GOOD.to_dict(), "samples_per_s": None}),
    "negative-time": json.dumps({**GOOD.to_dict(), "step_times_s": [-1.0]}),
    "rank-garbage": json.dumps({**GOOD.to_dict(), "ranks": [{"rank": "zero"}]}),
    "not-json": "{",
}


@pytest.mark.parametrize("payload", ROWS.values(), ids=ROWS.keys())
def test_a_malformed_trial_row_is_skipped_with_a_warning(tmp_path: Path, payload: str, caplog) -> None:
    cache = ResultsCache(tmp_path / "results.sqlite")
    cache.put_trial("k", MB8, GOOD)
    with sqlite3.connect(cache.path) as db:
        mb4 = json.dumps(Candidate(Rung.Z0, 4, False).to_dict())
        db.execute("INSERT INTO trials VALUES ('k', ?, ?, 0)", (mb4, payload))
        db.execute("INSERT INTO trials VALUES ('k', ?, '{}', 0)", ('{"rung": "z0", "micro_batch": "2"}',))
    with caplog.at_level(logging.WARNING):
        assert cache.trials("k") == {MB8: GOOD}
    assert caplog.text.count("skipped a malformed cached trial") == 2


def _store_recommendation(cache_path: Path, data: object) -> None:
    from autotune.cache import payload_checksum

    payload = json.dumps(data)
    with sqlite3.connect(cache_path) as db:
        key = db.execute("SELECT run_key FROM recommendations").fetchone()[0]
        db.execute("UPDATE recommendations SET payload = ?, checksum = ?", (payload, payload_checksum(payload)))
    assert key


def _stored(cache_path: Path) -> dict:
    with sqlite3.connect(cache_path) as db:
        return json.loads(db.execute("SELECT payload FROM recommendations").fetchone()[0])


@pytest.mark.parametrize(
    "tamper",
    [
        lambda hit: {k: v for k, v in hit.items() if k != "candidate"},
        lambda hit: {**hit, "candidate": {"rung": "z0", "micro_batch": "8", "grad_checkpointing": False}},
        lambda hit: {**hit, "ds_config": []},
        lambda hit: {**hit, "ds_config": {**hit["ds_config"], "tensorboard": {"enabled": True, "output_path": "/x"}}},
        lambda hit: [],
    ],
    ids=["missing-candidate", "string-micro-batch", "config-not-object", "config-not-what-we-build", "list"],
)
def test_a_malformed_cached_recommendation_is_tuned_again_without_a_crash(tmp_path: Path, tamper, caplog) -> None:
    request = tune_request(tmp_path, micro_batches=(1, 2, 4))
    first = tune(request, launcher=CountingLauncher())
    database = tmp_path / "cache.sqlite" / "results.sqlite"  # --cache-dir names a directory (tests/test_tune.py)
    _store_recommendation(database, tamper(_stored(database)))
    with caplog.at_level(logging.WARNING):
        again = tune(request, launcher=CountingLauncher())
    assert not again.from_cache and "tensorboard" not in again.config_path.read_text()
    assert again.config_path.read_bytes() == first.config_path.read_bytes()
    assert "cached" in caplog.text


def test_tuning_over_a_garbage_database_measures_and_verifies(tmp_path: Path) -> None:
    (tmp_path / "cache.sqlite").mkdir()  # --cache-dir names a directory; the database is results.sqlite in it
    (tmp_path / "cache.sqlite" / "results.sqlite").write_bytes(b"SQLite format 3\0" + os.urandom(4000))
    launcher = CountingLauncher()
    result = tune(tune_request(tmp_path, micro_batches=(1, 2, 4)), launcher=launcher)
    assert result.verified and launcher.specs
    assert tune(tune_request(tmp_path, micro_batches=(1, 2, 4)), launcher=CountingLauncher()).from_cache


def test_the_hook_over_a_corrupt_shared_cache_still_tunes_for_real(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "results.sqlite").write_bytes(os.urandom(8192))
    request = hook_request(tmp_path / "ds.json", shared, micro_batches=(1, 2, 4), rungs=(Rung.Z0,))
    result = run_hook(request, environ={}, launcher_chooser=lambda job, shared, env: CountingLauncher())
    assert (result.record.status, result.record.verified, result.record.source) == ("complete", True, "tuned")
