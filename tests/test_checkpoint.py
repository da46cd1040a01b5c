"""Unit tests of the checkpoint store, the privacy journal and the run-directory rules."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dclens.privacy import accounting
from dclens.runs import rundir
from dclens.runs.checkpoint import CheckpointDamaged, CheckpointError, CheckpointStore
from dclens.datalens.config import demo_preset
from dclens.datalens.run import plan_datalens_run
from dclens.runs.journal import JournalError, PrivacyJournal


def arrays(value: float) -> dict[str, np.ndarray]:
    return {"weights": np.full((3, 4), value, np.float32), "steps": np.arange(3),
            "scalar": np.array(7, np.int64)}


# ------------------------------------------------------------------ checkpoint store

def test_save_then_latest_round_trips_every_array(tmp_path):
    store = CheckpointStore(tmp_path / "ckpts")
    assert store.latest() is None
    store.save(5, arrays(1.5), {"note": "x"})
    latest = store.latest()
    assert latest.step == 5 and latest.state["note"] == "x"
    for name, want in arrays(1.5).items():
        got = latest.load_array(name)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_keeps_the_newest_two_by_default(tmp_path):
    """Two, so that a damaged newest checkpoint leaves one to resume from."""
    store = CheckpointStore(tmp_path)
    for step in (1, 2, 3):
        store.save(step, arrays(step), {})
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000002", "ckpt-000003"]
    assert store.latest().step == 3
    CheckpointStore(tmp_path, keep=1).save(4, arrays(4), {})
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000004"]


def test_saving_the_same_step_again_replaces_it(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(4, arrays(1.0), {"finished": False})
    store.save(4, arrays(2.0), {"finished": True})
    assert store.latest().state["finished"] is True
    assert store.latest().load_array("weights")[0, 0] == 2.0
    assert os.listdir(tmp_path) == ["ckpt-000004"]


def test_a_crash_before_the_rename_leaves_the_previous_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, arrays(1.0), {})

    class Killed(BaseException):
        pass

    def die():
        raise Killed()

    with pytest.raises(Killed):
        store.save(2, arrays(2.0), {}, before_commit=die)
    assert store.latest().step == 1
    # What a SIGKILL leaves (the except clause cannot run): a temporary folder.
    os.makedirs(tmp_path / ".tmp-ckpt-000002-999")
    (tmp_path / ".tmp-ckpt-000002-999" / "weights.npy").write_bytes(b"partial")
    assert store.latest().step == 1
    assert store.remove_partial() == [str(tmp_path / ".tmp-ckpt-000002-999")]
    assert os.listdir(tmp_path) == ["ckpt-000001"]


def _garble(path, offset: int) -> None:
    """Flips one byte at ``offset`` from the end: same size, different bytes."""
    data = bytearray(path.read_bytes())
    data[-offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_garbled_array_of_the_right_size_is_refused_by_name(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, arrays(1.0), {})
    store.save(2, arrays(2.0), {})
    path = tmp_path / "ckpt-000002" / "weights.npy"
    size = path.stat().st_size
    _garble(path, 5)                     # inside the float data: still a valid .npy
    assert path.stat().st_size == size
    assert np.load(path).shape == (3, 4)           # numpy alone would load it silently
    latest = store.latest()
    with pytest.raises(CheckpointDamaged) as error:
        latest.load_array("weights")
    message = str(error.value)
    assert f"{path} is damaged: its SHA-256 is" in message
    assert f"mv {tmp_path / 'ckpt-000002'} {tmp_path / 'ckpt-000002'}.damaged" in message
    np.testing.assert_array_equal(latest.load_array("steps"), np.arange(3))  # others fine
    # Moved aside as the message says, the older checkpoint is the one resumed from.
    os.rename(tmp_path / "ckpt-000002", tmp_path / "ckpt-000002.damaged")
    assert store.latest().step == 1
    assert store.latest().load_array("weights")[0, 0] == 1.0


def test_a_garbled_state_file_is_refused_by_name(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(3, arrays(1.0), {"journal_entries": 12})
    state = tmp_path / "ckpt-000003" / "state.json"
    text = state.read_text()
    state.write_text(text.replace('"journal_entries": 12', '"journal_entries": 10'))
    assert json.loads(state.read_text())["journal_entries"] == 10   # still valid JSON
    with pytest.raises(CheckpointDamaged, match=f"{state} is damaged: its content does not "
                                                "match its state_sha256"):
        store.latest()
    with pytest.raises(CheckpointDamaged):
        store.at(3)


def test_a_version_1_checkpoint_without_checksums_still_loads_with_its_shape_check(tmp_path):
    """Checkpoints written before checksums existed resume as before (no digest to check)."""
    store = CheckpointStore(tmp_path)
    store.save(1, arrays(1.0), {})
    state_path = tmp_path / "ckpt-000001" / "state.json"
    state = json.loads(state_path.read_text())
    state["version"] = 1
    del state["state_sha256"]
    for described in state["arrays"].values():
        del described["sha256"]
    state_path.write_text(json.dumps(state))
    np.testing.assert_array_equal(store.latest().load_array("weights"), arrays(1.0)["weights"])
    path = tmp_path / "ckpt-000001" / "weights.npy"
    np.save(path, np.zeros((2, 2), np.float32))
    with pytest.raises(CheckpointError, match=r"holds float32\[2, 2\], but state.json says "
                                              r"float32\[3, 4\]"):
        store.latest().load_array("weights")
    path.write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(CheckpointError, match="the checkpoint is damaged"):
        store.latest().load_array("weights")


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="keep must be an integer >= 1, got 0"):
        CheckpointStore(tmp_path, keep=0)
    with pytest.raises(ValueError, match="'../evil' is not a simple file name"):
        CheckpointStore(tmp_path).save(1, {"../evil": np.zeros(1)}, {})


# ------------------------------------------------------------------ privacy journal

def new_journal(path) -> PrivacyJournal:
    return PrivacyJournal(path, accounting.PrivacyLedger(delta=1e-5, conversion="classic"))


def spend(journal: PrivacyJournal, step: int, queries: int = 10) -> None:
    journal.ledger.spend_topagg(sigma=20.0, topk=50, queries=queries)
    journal.append(step, 0, queries)


def test_every_append_is_on_disk(tmp_path):
    journal = new_journal(tmp_path / "ledger.json")
    journal.write()
    for step in range(3):
        spend(journal, step)
        on_disk = PrivacyJournal.load(tmp_path / "ledger.json")
        assert on_disk.queries == 10 * (step + 1)
        assert on_disk.ledger.epsilon().epsilon == journal.ledger.epsilon().epsilon


def test_append_without_a_ledger_spend_is_refused(tmp_path):
    journal = new_journal(tmp_path / "ledger.json")
    with pytest.raises(JournalError, match="ledger counts 0 queries but the journal 10"):
        journal.append(0, 0, 10)
    assert not (tmp_path / "ledger.json").exists()


def test_resume_marks_the_spends_after_the_checkpoint_lost(tmp_path):
    journal = new_journal(tmp_path / "ledger.json")
    for step in range(4):
        spend(journal, step)
    loaded = PrivacyJournal.load(tmp_path / "ledger.json")
    lost = loaded.resume(entries_at_checkpoint=2, resumed_from_step=2)
    assert [s.step for s in lost] == [2, 3]
    assert loaded.queries == 40 and loaded.lost_queries == 20      # still counted
    again = PrivacyJournal.load(tmp_path / "ledger.json")
    assert again.lost == loaded.lost and again.queries == 40


def test_a_second_crash_before_a_new_checkpoint_lists_only_newly_lost_spends(tmp_path):
    """Checkpoint after 2 entries; crash 1 loses entries 2-3; the resumed run spends 2 more
    and crashes before its next checkpoint: only those 2 are newly lost (entries 2-3 were
    listed already), and a crash before any new spend loses nothing new."""
    journal = new_journal(tmp_path / "ledger.json")
    for step in range(4):
        spend(journal, step)
    first = PrivacyJournal.load(tmp_path / "ledger.json")
    assert [s.step for s in first.resume(entries_at_checkpoint=2, resumed_from_step=2)] \
        == [2, 3]
    for step in (2, 3):
        spend(first, step)
    second = PrivacyJournal.load(tmp_path / "ledger.json")
    newly = second.resume(entries_at_checkpoint=2, resumed_from_step=2)
    assert len(newly) == 2 and second.queries == 60
    assert second.lost_queries == 40 and len(second.lost) == 2
    third = PrivacyJournal.load(tmp_path / "ledger.json")
    assert third.resume(entries_at_checkpoint=2, resumed_from_step=2) == []
    assert third.lost_queries == 40 and len(third.lost) == 2 and third.queries == 60


def test_resume_refuses_a_journal_shorter_than_the_checkpoint(tmp_path):
    journal = new_journal(tmp_path / "ledger.json")
    spend(journal, 0)
    with pytest.raises(JournalError, match="saw 3 journaled spends but .* holds only 1"):
        PrivacyJournal.load(tmp_path / "ledger.json").resume(entries_at_checkpoint=3,
                                                             resumed_from_step=3)


@pytest.mark.parametrize("damage,message", [
    (lambda r: r.update(queries=r["queries"] + 1), "inconsistent"),
    (lambda r: r["entries"].pop(), "inconsistent"),
    (lambda r: r.update(version=99), "not a version-1 dclens privacy journal"),
    (lambda r: r.pop("entries"), "malformed"),
])
def test_a_modified_journal_is_not_trusted(tmp_path, damage, message):
    path = tmp_path / "ledger.json"
    journal = new_journal(path)
    spend(journal, 0)
    spend(journal, 1)
    record = json.loads(path.read_text())
    damage(record)
    path.write_text(json.dumps(record))
    with pytest.raises(JournalError, match=message):
        PrivacyJournal.load(path)


def test_missing_or_unreadable_journal(tmp_path):
    with pytest.raises(JournalError, match="is missing"):
        PrivacyJournal.load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(JournalError, match="cannot be read"):
        PrivacyJournal.load(tmp_path / "bad.json")


# ------------------------------------------------------------------ run-directory rules

def test_config_differences_name_every_setting():
    a = demo_preset()
    b = a.replace(topagg={"sigma": 10.0}, train={"epochs": 3})
    assert rundir.config_differences(a.to_dict(), b.to_dict()) == [
        ("topagg.sigma", 50.0, 10.0), ("train.epochs", 1000, 3)]


def test_plan_for_new_empty_and_foreign_directories(tmp_path):
    config = demo_preset()
    assert plan_datalens_run(config, str(tmp_path / "new")).mode is rundir.Mode.FRESH
    assert not (tmp_path / "new").exists()
    (tmp_path / "empty").mkdir()
    assert plan_datalens_run(config, str(tmp_path / "empty")).mode is rundir.Mode.FRESH
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "model.ckpt").write_text("tf1")
    with pytest.raises(rundir.RunDirError, match="is not empty and is not a dclens run "
                                                 r"\(it holds model.ckpt\)"):
        plan_datalens_run(config, str(tmp_path / "foreign"))
    plan = plan_datalens_run(config, str(tmp_path / "foreign"), restart=True)
    assert plan.mode is rundir.Mode.FRESH and plan.set_aside


def _write_config(run: str, config: dict) -> None:
    os.makedirs(run)
    with open(os.path.join(run, "config.json"), "w") as stream:
        json.dump({"config": config}, stream)


def test_a_run_from_an_older_dclens_resumes_when_new_settings_stay_at_their_default(tmp_path):
    config = demo_preset()
    older = config.to_dict()
    del older["train"]["fake_rendering"]          # a setting added after the run started
    del older["topagg"]["klevel"]
    run = str(tmp_path / "run")
    _write_config(run, older)
    assert plan_datalens_run(config, run).mode is rundir.Mode.RESUME
    # The same missing setting at a non-default value is a real difference, named.
    changed = config.replace(topagg={"klevel": 8})
    with pytest.raises(rundir.RunDirError, match=r"topagg.klevel \(privacy-relevant\): "
                                                 r"saved 4, now 8"):
        plan_datalens_run(changed, run)
    # A setting the older run did record is compared as before.
    with pytest.raises(rundir.RunDirError, match=r"topagg.sigma"):
        plan_datalens_run(config.replace(topagg={"sigma": 1.0}), run)


def test_set_aside_never_overwrites(tmp_path):
    first, second = tmp_path / "run", tmp_path / "run2"
    first.mkdir()
    moved = rundir.set_aside(str(first))
    first.mkdir()
    (first / "x").write_text("1")
    moved_again = rundir.set_aside(str(first))
    assert moved != moved_again and os.path.isdir(moved) and os.path.isdir(moved_again)
    assert not second.exists()


def test_low_disk_removes_the_old_checkpoint_first_or_refuses(tmp_path, monkeypatch):
    import collections
    import shutil

    from dclens.runs import checkpoint
    from dclens.runs.checkpoint import CheckpointSpaceError

    store = CheckpointStore(tmp_path)
    store.save(1, arrays(1.0), {})
    usage = collections.namedtuple("usage", "total used free")
    free = {"bytes": 10 << 30}

    def fake_usage(path):
        # Room for one checkpoint only while ckpt-000001 exists.
        has_old = (tmp_path / "ckpt-000001").exists()
        return usage(0, 0, free["bytes"] if not has_old else 1 << 10)

    monkeypatch.setattr(checkpoint.shutil, "disk_usage", fake_usage)
    store.save(2, arrays(2.0), {})
    assert os.listdir(tmp_path) == ["ckpt-000002"]
    free["bytes"] = 1 << 10
    shutil.rmtree(tmp_path / "ckpt-000002")
    with pytest.raises(CheckpointSpaceError, match="GiB free; free disk space"):
        store.save(3, arrays(3.0), {})
    assert os.listdir(tmp_path) == []


def test_room_for_the_final_outputs_comes_from_older_checkpoints_never_the_newest(
        tmp_path, monkeypatch):
    # A finished run writes its samples after the final checkpoint; a paper-scale run
    # filled the disk there.  Older checkpoints are spares once the final one is complete:
    # they go first, oldest first, and only while space is short; the newest always stays.
    import collections

    from dclens.runs import checkpoint

    store = CheckpointStore(tmp_path, keep=3)
    for step in (60, 120, 183):
        store.save(step, arrays(float(step)), {})
    usage = collections.namedtuple("usage", "total used free")
    per_checkpoint = 100

    def fake_usage(path):
        # 50 bytes free, plus 100 for every checkpoint removed since
        removed = 3 - len([n for n in os.listdir(tmp_path) if n.startswith("ckpt-")])
        return usage(0, 0, 50 + per_checkpoint * removed)

    monkeypatch.setattr(checkpoint.shutil, "disk_usage", fake_usage)
    assert store.make_room_beside_latest(40) == []                   # room already
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000060", "ckpt-000120", "ckpt-000183"]
    removed = store.make_room_beside_latest(120)                     # one spare is enough
    assert removed == [str(tmp_path / "ckpt-000060")]
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000120", "ckpt-000183"]
    removed = store.make_room_beside_latest(10 ** 6)                 # never the newest
    assert removed == [str(tmp_path / "ckpt-000120")]
    assert os.listdir(tmp_path) == ["ckpt-000183"]
    assert store.latest().step == 183
