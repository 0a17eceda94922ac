"""A shared cache we can trust and survive: planted records refused, every corruption skipped or rebuilt.

Planting a file "from another user" needs root (os.chown to uid 65534); those tests skip otherwise.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from tests.fakes.hook import TUNED, FakeTune, hook_request
from tests.fakes.launchers import CountingLauncher
from tests.fakes.requests import tune_request

from autotune import tune
from autotune.core.ladder import Candidate, Rung
from autotune.hook import run_hook
from autotune.hook.coordinate import HookRecord, SharedSlot, coordinate, publish, read_record
from autotune.infra.atomic import atomic_write_text
from autotune.infra.sharing import distrust_reason
from autotune.search.cache import ResultsCache
from autotune.trial.trial_types import RankMetrics, TrialResult, TrialSpec

OTHER = 65534  # nobody / nogroup
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's file needs root (os.chown)")
GOOD = TrialResult("ok", ranks=[RankMetrics(0, host_rss_peak_bytes=2**20)], step_times_s=[0.1] * 3, samples_per_s=80.0)
MB8 = Candidate(Rung.Z0, 8, False)


def planted(key: str, config: dict) -> HookRecord:
    """The issue's attack: a well-formed, correctly checksummed record of the planter's choosing."""
    return HookRecord(
        key,
        "complete",
        json.dumps(config),
        "tuned",
        verified=True,
        job_id=None,
        hardware="cpu x86_64 budget 1GiB",
        leader="x",
        created=0.0,
    )


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
    from autotune.hook.coordinate import record_file

    atomic_write_text(slot.record_path, json.dumps(record_file(slot, body)))  # checksummed and signed
    record, why = read_record(slot)
    assert record is None and why and why.startswith("malformed")


def test_a_symlinked_record_is_not_followed(tmp_path: Path) -> None:
    elsewhere = SharedSlot(tmp_path / "elsewhere", "k1")
    publish(elsewhere, planted("k1", TUNED))
    slot = SharedSlot(tmp_path / "hook", "k1")
    slot.directory.mkdir()
    slot.record_path.symlink_to(elsewhere.record_path)
    record, why = read_record(slot)
    assert record is None and why and why.startswith("not trusted: a symlink")  # refused before any open


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
        # signed with this user's key: the rows verify, and their content is what must be refused
        db.execute("INSERT INTO signed_trials VALUES (?, ?, ?, ?, ?)", cache.trial_row("k", mb4, payload))
        bad_candidate = cache.trial_row("k", '{"rung": "z0", "micro_batch": "2"}', "{}")
        db.execute("INSERT INTO signed_trials VALUES (?, ?, ?, ?, ?)", bad_candidate)
    with caplog.at_level(logging.WARNING):
        assert cache.trials("k") == {MB8: GOOD}
    assert caplog.text.count("skipped a malformed cached trial") == 2


def _store_recommendation(cache_path: Path, data: object) -> None:
    """Replace the stored answer with `data`, signed with this user's key (its content is what must be refused)."""
    with sqlite3.connect(cache_path) as db:
        key = db.execute("SELECT run_key FROM signed_recommendations").fetchone()[0]
        row = ResultsCache(cache_path).recommendation_row(key, json.dumps(data))
        db.execute("INSERT OR REPLACE INTO signed_recommendations VALUES (?, ?, ?, ?)", row)
    assert key


def _stored(cache_path: Path) -> dict:
    with sqlite3.connect(cache_path) as db:
        return json.loads(db.execute("SELECT payload FROM signed_recommendations").fetchone()[0])


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
    result = run_hook(request, environ={}, launcher_chooser=lambda job, tuning, shared, env: CountingLauncher())
    assert (result.record.status, result.record.verified, result.record.source) == ("complete", True, "tuned")


# --- the cache trusts only its owner: planted journals, shared directories, forged rows ------------------------

FORGED = TrialResult("ok", ranks=[RankMetrics(0, host_rss_peak_bytes=1000)], step_times_s=[1e-9] * 3,
                     samples_per_s=1e9, tokens_per_s=64e9)  # fmt: skip  # the issue's forged row


def _cache_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "not using results cache" in line]


def _hot_journal(database: Path) -> Path:
    """A real hot rollback journal: a writer that changed the database and died before committing."""
    import subprocess
    import sys

    crash = (
        "import os, sqlite3, sys\n"
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "db.execute('PRAGMA cache_size=1')\n"  # spill the changed pages into the database file before commit
        "db.execute('BEGIN')\n"
        "db.execute('UPDATE signed_trials SET created = created + 1')\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", crash, str(database)], check=True)
    journal = Path(f"{database}-journal")
    assert journal.stat().st_size > 0
    return journal


@as_root
def test_a_hot_journal_planted_by_another_user_is_refused_in_one_line(tmp_path: Path, caplog) -> None:
    request = tune_request(tmp_path, micro_batches=(1, 2, 4))
    tune(request, launcher=CountingLauncher())
    database = Path(request.output.cache_dir) / "results.sqlite"
    journal = _hot_journal(database)
    os.chown(journal, OTHER, OTHER)
    os.chmod(journal, 0o666)
    before = database.read_bytes(), journal.read_bytes()
    with caplog.at_level(logging.WARNING):
        result = tune(request, launcher=CountingLauncher())
    assert result.verified and not result.from_cache and result.config_path.exists()  # the tune still completes
    lines = _cache_lines(caplog.text)
    assert len(lines) == 1 and "results.sqlite-journal" in lines[0] and "uid 65534" in lines[0]
    assert "remove it" in lines[0]
    assert (database.read_bytes(), journal.read_bytes()) == before  # not replayed into the user's database


@as_root
def test_a_foreign_owned_database_gives_one_line_and_the_tune_completes(tmp_path: Path, caplog) -> None:
    request = tune_request(tmp_path, micro_batches=(1, 2, 4))
    tune(request, launcher=CountingLauncher())
    os.chown(Path(request.output.cache_dir) / "results.sqlite", OTHER, OTHER)
    with caplog.at_level(logging.WARNING):
        result = tune(request, launcher=CountingLauncher())
    assert result.verified and not result.from_cache and result.trials_launched > 0
    lines = _cache_lines(caplog.text)
    assert len(lines) == 1 and "owned by uid 65534" in lines[0] and "chmod 2770" in lines[0]


def test_a_world_writable_cache_directory_gives_one_line_and_the_tune_completes(tmp_path: Path, caplog) -> None:
    shared = tmp_path / "tmp-like"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    request = tune_request(tmp_path, micro_batches=(1, 2, 4), cache_dir=str(shared))
    with caplog.at_level(logging.WARNING):
        result = tune(request, launcher=CountingLauncher())
        again = tune(request, launcher=CountingLauncher())
    assert result.verified and result.config_path.exists() and not again.from_cache
    lines = _cache_lines(caplog.text)
    assert len(lines) == 2 and all("writable by every user (mode 1777)" in line for line in lines)
    assert not list(shared.iterdir())  # nothing written where anyone can write


def test_a_group_writable_directory_without_setgid_is_refused(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o775)
    cache = ResultsCache(loose / "results.sqlite")
    assert "without the setgid bit" in (cache.untrusted or "")
    cache.put_trial("k", MB8, GOOD)
    assert not (loose / "results.sqlite").exists()


def test_a_row_signed_with_another_key_is_dropped_and_measured_again(tmp_path: Path, caplog, monkeypatch) -> None:
    """Another user can write rows into a file they can reach, but not with this user's key."""
    request = tune_request(tmp_path, micro_batches=(1, 2, 4))
    first = tune(request, launcher=CountingLauncher())
    database = Path(request.output.cache_dir) / "results.sqlite"
    own_config = os.environ["XDG_CONFIG_HOME"]
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "mallory"))  # a different user's key
    mallory = ResultsCache(database)
    with sqlite3.connect(database) as db:
        rows = db.execute("SELECT run_key, candidate FROM signed_trials").fetchall()
        db.execute("DELETE FROM signed_recommendations")
        for run_key, candidate in rows:
            db.execute("INSERT OR REPLACE INTO signed_trials VALUES (?, ?, ?, ?, ?)",
                       mallory.trial_row(run_key, candidate, json.dumps(FORGED.to_dict())))  # fmt: skip
    monkeypatch.setenv("XDG_CONFIG_HOME", own_config)
    launcher = CountingLauncher()
    with caplog.at_level(logging.WARNING):
        again = tune(request, launcher=launcher)
    assert caplog.text.count("signature does not verify") == len(rows)
    assert len(launcher.specs) >= len(rows) and again.samples_per_s == first.samples_per_s
    assert "1000000000" not in again.report_path.read_text()


def test_a_correctly_signed_but_impossible_row_is_refused_as_corrupt(tmp_path: Path, caplog) -> None:
    """1e9 samples/s and a 1000 B peak: above the machine's peak FLOP/s for the model, below its own weights."""
    request = tune_request(tmp_path, micro_batches=(1, 2, 4))
    first = tune(request, launcher=CountingLauncher())
    database = Path(request.output.cache_dir) / "results.sqlite"
    cache = ResultsCache(database)
    with sqlite3.connect(database) as db:
        db.execute("DELETE FROM signed_recommendations")
        rows = db.execute("SELECT run_key, candidate FROM signed_trials").fetchall()
        for run_key, candidate in rows:
            db.execute("INSERT OR REPLACE INTO signed_trials VALUES (?, ?, ?, ?, ?)",
                       cache.trial_row(run_key, candidate, json.dumps(FORGED.to_dict())))  # fmt: skip
    launcher = CountingLauncher()
    with caplog.at_level(logging.WARNING):
        again = tune(request, launcher=launcher)
    assert caplog.text.count("as corrupt") == len(rows) and "FLOP/s" in caplog.text
    assert again.samples_per_s == first.samples_per_s and len(launcher.specs) >= len(rows)
    with caplog.at_level(logging.WARNING):
        third = tune(request, launcher=CountingLauncher())
    assert third.from_cache and third.samples_per_s == first.samples_per_s  # the re-measured rows replaced them


def test_a_resigned_row_claiming_only_samples_per_s_is_bounded_too(tmp_path: Path, caplog) -> None:
    """Issue 46: a row re-signed with the user's key, 1e9 samples/s, no tokens/s and no memory figure, became the
    pick's speed (the bound read tokens/s only); now its samples/s times the run's sequence length is bounded."""
    request = tune_request(tmp_path, micro_batches=(1, 2))
    first = tune(request, launcher=CountingLauncher())
    database = Path(request.output.cache_dir) / "results.sqlite"
    cache = ResultsCache(database)
    forged = TrialResult("ok", step_times_s=[1e-9] * 3, samples_per_s=1e9)
    with sqlite3.connect(database) as db:
        db.execute("DELETE FROM signed_recommendations")
        rows = db.execute("SELECT run_key, candidate FROM signed_trials").fetchall()
        for run_key, candidate in rows:
            db.execute("INSERT OR REPLACE INTO signed_trials VALUES (?, ?, ?, ?, ?)",
                       cache.trial_row(run_key, candidate, json.dumps(forged.to_dict())))  # fmt: skip
    launcher = CountingLauncher()
    with caplog.at_level(logging.WARNING):
        again = tune(request, launcher=launcher)
    assert caplog.text.count("as corrupt") == len(rows) and "FLOP/s" in caplog.text
    assert again.samples_per_s == first.samples_per_s and len(launcher.specs) >= len(rows)


def test_an_impossible_measurement_from_a_trial_is_not_believed(tmp_path: Path) -> None:
    class Impossible(CountingLauncher):
        def run(self, spec: TrialSpec) -> TrialResult:
            measured = super().run(spec)
            impossible = replace(measured, ranks=[RankMetrics(0, host_rss_peak_bytes=1000)])
            return impossible if len(self.specs) == 1 else measured

    launcher = Impossible()
    result = tune(tune_request(tmp_path, micro_batches=(1, 2, 4)), launcher=launcher)
    first = result.report.to_json()["trials"][0]
    assert first["result"]["status"] == "ok" and first["result"]["ranks"][0]["host_rss_peak_bytes"] > 1000
    assert launcher.specs[0] == launcher.specs[1]  # the implausible run was run once more


READ_ONLY_TUNE = """
import logging, os, sys
from tests.fakes.launchers import CountingLauncher
from tests.fakes.requests import tune_request
from autotune import tune
from pathlib import Path
logging.basicConfig(level=logging.WARNING, format="%(message)s")
os.environ["AUTOTUNE_CACHE_DIR"] = sys.argv[2]  # the default cache location (an explicit --cache-dir is checked
result = tune(tune_request(Path(sys.argv[1]), micro_batches=(1, 2, 4), cache_dir=None),  # as an input: exit 2)
              launcher=CountingLauncher())
print("verified", result.verified, result.config_path)
"""


@as_root
def test_a_read_only_cache_degrades_to_no_cache_with_one_line(tmp_path: Path) -> None:
    """The default cache location on a read-only file system (a read-only home in a container): a private mount
    namespace's read-only bind mount, so nothing outside the test sees it."""
    import shutil
    import subprocess
    import sys

    request = tune_request(tmp_path, micro_batches=(1, 2, 4))
    tune(request, launcher=CountingLauncher())  # a populated cache, then mounted read-only
    cache_dir = request.output.cache_dir
    (tmp_path / "out").mkdir()
    script = (
        f"mount --bind {cache_dir} {cache_dir} && mount -o remount,bind,ro {cache_dir} && "
        f"exec {sys.executable} -c '{READ_ONLY_TUNE}' {tmp_path / 'out'} {cache_dir}"
    )
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is missing")
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parent.parent, env=os.environ)  # fmt: skip
    if "mount:" in done.stderr and "permission denied" in done.stderr.lower():
        pytest.skip("no permission for a private read-only mount here")
    assert done.returncode == 0, done.stderr
    lines = _cache_lines(done.stderr)
    assert len(lines) == 1 and "read-only file system" in lines[0]
    assert "Traceback" not in done.stderr and "verified True" in done.stdout


def test_a_published_hook_record_signed_with_another_key_is_not_believed(tmp_path: Path, monkeypatch) -> None:
    """Checksummed, well formed and ours by file ownership, but written by someone without our key."""
    slot = SharedSlot(tmp_path / "hook", "k1")
    own_config = os.environ["XDG_CONFIG_HOME"]
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "mallory"))
    publish(slot, planted("k1", TUNED))
    monkeypatch.setenv("XDG_CONFIG_HOME", own_config)
    record, why = read_record(slot)
    assert record is None and "signature does not verify" in (why or "")
    publish(slot, planted("k1", TUNED))
    assert read_record(slot)[0] == planted("k1", TUNED)


def _summary_file(name: str) -> tuple[Path, dict]:
    from autotune.models.model_summary import _cache_path, summarize
    from autotune.models.resolve import resolve_model

    source = resolve_model(name)
    built = summarize(source)
    path = _cache_path(source)
    if not path.exists():  # a shipped summary answered: store it as a built one would be
        atomic_write_text(path, json.dumps(built.to_dict()))
    return path, built.to_dict()


@pytest.mark.parametrize(
    "forgery",
    [{"total_params": 0, "trainable_params": 0, "largest_layer_params": 0, "embedding_params": 0},
     {"trainable_params": 10**15}, {"fingerprint": "0" * 16}, {"num_layers": 0}],
    ids=["zero-params", "part-above-whole", "other-config", "no-layers"],
)  # fmt: skip
def test_a_forged_cached_model_summary_is_rebuilt(forgery: dict, caplog) -> None:
    from autotune.models.model_summary import summarize
    from autotune.models.resolve import resolve_model

    path, genuine = _summary_file("tiny-gpt2")
    atomic_write_text(path, json.dumps({**genuine, **forgery}))
    with caplog.at_level(logging.WARNING):
        summary = summarize(resolve_model("tiny-gpt2"))
    assert summary.total_params == genuine["total_params"] > 0
    assert "ignored cached model summary" in caplog.text


@as_root
def test_a_cached_model_summary_owned_by_another_user_is_not_believed(caplog) -> None:
    from autotune.models.model_summary import summarize
    from autotune.models.resolve import resolve_model

    path, genuine = _summary_file("tiny-gpt2")
    atomic_write_text(path, json.dumps({**genuine, "total_params": genuine["total_params"] * 1000}))
    os.chown(path, OTHER, OTHER)
    with caplog.at_level(logging.WARNING):
        summary = summarize(resolve_model("tiny-gpt2"))
    assert summary.total_params == genuine["total_params"] and "owned by uid 65534" in caplog.text
    caplog.clear()
    summarize(resolve_model("tiny-gpt2"))
    assert "ignored" not in caplog.text  # a genuine entry is believed
