"""Crash, resume, refuse: the run directory and its write-ahead privacy journal.

A crash is simulated in-process by a fault hook that raises at a named point (the real
SIGKILL version is tests/test_faults.py).  The uninterrupted reference run and the crashed
+ resumed runs use the same seed, so on a checkpoint boundary they must agree bit for bit.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dclens.privacy import accounting
from dclens.datalens import run
from dclens.runs.checkpoint import CheckpointDamaged
from dclens.runs.journal import JournalError, PrivacyJournal
from dclens.datalens.draws import SeededDraws
from dclens.datalens.train import DataLens
from conftest import snapshot
from test_end_to_end import BATCH, SIGMA, TOPK, tiny_config

STEPS = 4


class Crash(BaseException):
    """Stands in for a SIGKILL: nothing after the raise point runs."""


def crash_at(point: str, step: int):
    def hook(where: str, at: int) -> None:
        if (where, at) == (point, step):
            raise Crash(f"{point}:{step}")
    return hook


def train(data_dir, out, **kwargs):
    kwargs.setdefault("checkpoint_every", 1)
    config = kwargs.pop("config", None) or tiny_config(data_dir, steps=STEPS)
    return run.train_run(config, str(out), progress=False, log=lambda _: None, **kwargs)


def curve(out):
    return json.loads((out / "privacy.json").read_text())["epsilon_per_step"]


def samples(out):
    return np.load(out / "samples.npz")["x"]


def epsilon_of(queries: int) -> float:
    ledger = accounting.PrivacyLedger(delta=1e-5, conversion="classic")
    ledger.spend_topagg(sigma=SIGMA, topk=TOPK, queries=queries)
    return ledger.epsilon().epsilon


@pytest.fixture(scope="module")
def reference(tiny_fmnist_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "run"
    summary = train(tiny_fmnist_dir, out)
    assert summary.steps == STEPS and summary.stop_reason == "budget"
    return out


def test_crash_on_a_checkpoint_boundary_resumes_bit_identically(reference, tiny_fmnist_dir,
                                                                 tmp_path):
    out = tmp_path / "run"
    with pytest.raises(Crash):
        train(tiny_fmnist_dir, out, fault_hook=crash_at("after_checkpoint", 2))
    assert sorted(os.listdir(out / "checkpoints")) == ["PRIVATE", "ckpt-000001", "ckpt-000002",
                                                       "seed.json"]
    assert not (out / "samples.npz").exists()
    summary = train(tiny_fmnist_dir, out)
    assert summary.resumed_from_step == 2 and summary.lost_queries == 0
    assert curve(out) == curve(reference)
    np.testing.assert_array_equal(samples(out), samples(reference))


def asked_before_step(step: int):
    """A ``should_stop`` that says yes when read before generator step ``step`` (0-based;
    it is read once before every step)."""
    reads = iter(range(10 ** 6))
    return lambda: next(reads) >= step


def test_a_requested_stop_checkpoints_the_step_it_reached_and_resumes_bit_identically(
        reference, tiny_fmnist_dir, tmp_path):
    """Between checkpoints (every 10 steps, none due): the pause writes one of step 2, so
    the resume redoes nothing; without it the two steps' spends would count as lost."""
    out = tmp_path / "run"
    with pytest.raises(run.RunPaused) as paused:
        train(tiny_fmnist_dir, out, checkpoint_every=10, should_stop=asked_before_step(2))
    assert isinstance(paused.value, KeyboardInterrupt) and paused.value.step == 2
    assert sorted(os.listdir(out / "checkpoints")) == ["PRIVATE", "ckpt-000002", "seed.json"]
    assert json.loads((out / "ledger.json").read_text())["queries"] == 2 * BATCH
    assert not (out / "samples.npz").exists()
    summary = train(tiny_fmnist_dir, out, checkpoint_every=10)
    assert summary.resumed_from_step == 2 and summary.lost_queries == 0
    assert curve(out) == curve(reference)
    np.testing.assert_array_equal(samples(out), samples(reference))


def test_a_stop_on_a_checkpoint_boundary_or_before_the_first_step_writes_no_second_one(
        reference, tiny_fmnist_dir, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(run.RunPaused):
        train(tiny_fmnist_dir, out, checkpoint_every=1, should_stop=asked_before_step(2))
    assert sorted(os.listdir(out / "checkpoints")) == ["PRIVATE", "ckpt-000001", "ckpt-000002",
                                                       "seed.json"]
    fresh = tmp_path / "fresh"
    with pytest.raises(run.RunPaused) as paused:
        train(tiny_fmnist_dir, fresh, should_stop=asked_before_step(0))
    assert paused.value.step == 0
    assert sorted(os.listdir(fresh / "checkpoints")) == ["PRIVATE", "seed.json"]
    assert json.loads((fresh / "ledger.json").read_text())["queries"] == 0
    summary = train(tiny_fmnist_dir, fresh)
    assert summary.lost_queries == 0
    np.testing.assert_array_equal(samples(fresh), samples(reference))


def test_crash_between_checkpoints_keeps_the_lost_spend(reference, tiny_fmnist_dir, tmp_path):
    out = tmp_path / "run"
    # Step index 2's queries are journaled, then the process dies before its noise is
    # used: the checkpoint holds 2 steps, the journal 3 steps' queries.
    with pytest.raises(Crash):
        train(tiny_fmnist_dir, out, fault_hook=crash_at("after_spend", 2))
    journal = json.loads((out / "ledger.json").read_text())
    assert journal["queries"] == 3 * BATCH
    summary = train(tiny_fmnist_dir, out)
    assert summary.resumed_from_step == 2 and summary.lost_queries == BATCH
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["lost_spends"] == [{"resumed_from_step": 2, "queries": BATCH,
                                       "spends": [{"step": 2, "round": 0, "queries": BATCH}],
                                       "to_entry": 3}]      # the journal's length then
    resumed, uninterrupted = curve(out), curve(reference)
    assert resumed[:2] == uninterrupted[:2]
    for got, want in zip(resumed, uninterrupted):
        assert got["epsilon"] >= want["epsilon"]
    # After the resume every step carries one extra round of queries...
    assert resumed[2]["queries"] == 4 * BATCH
    assert resumed[2]["epsilon"] == pytest.approx(epsilon_of(4 * BATCH), rel=1e-12)
    assert resumed[2]["epsilon"] > uninterrupted[2]["epsilon"]
    # ...so the budget (4 steps' worth) stops it one step earlier, at the same epsilon.
    assert summary.steps == 3 and summary.queries == 4 * BATCH
    assert summary.epsilon == pytest.approx(uninterrupted[-1]["epsilon"], rel=1e-12)


def test_crash_before_the_first_checkpoint_replays_from_the_start(reference, tiny_fmnist_dir,
                                                                    tmp_path):
    out = tmp_path / "run"
    with pytest.raises(Crash):
        train(tiny_fmnist_dir, out, checkpoint_every=10, fault_hook=crash_at("after_step", 1))
    summary = train(tiny_fmnist_dir, out)
    assert summary.resumed_from_step == 0 and summary.lost_queries == BATCH
    assert curve(out)[0]["epsilon"] == pytest.approx(epsilon_of(2 * BATCH), rel=1e-12)


def test_crash_inside_a_checkpoint_write_leaves_the_previous_one(reference, tiny_fmnist_dir,
                                                                  tmp_path):
    out = tmp_path / "run"
    with pytest.raises(Crash):
        train(tiny_fmnist_dir, out, fault_hook=crash_at("checkpoint_before_commit", 3))
    assert sorted(os.listdir(out / "checkpoints")) == ["PRIVATE", "ckpt-000001", "ckpt-000002",
                                                       "seed.json"]
    summary = train(tiny_fmnist_dir, out)
    assert summary.resumed_from_step == 2 and summary.lost_queries == BATCH


def test_a_garbled_checkpoint_is_refused_before_any_spend_and_the_older_one_resumes(
        reference, tiny_fmnist_dir, tmp_path):
    """Same-size garbage in the newest checkpoint's teacher weights: the resume refuses it by
    name and spends nothing; moved aside, the run resumes from the one kept before it."""
    out = tmp_path / "run"
    with pytest.raises(Crash):
        train(tiny_fmnist_dir, out, fault_hook=crash_at("after_checkpoint", 3))
    assert sorted(os.listdir(out / "checkpoints")) == ["PRIVATE", "ckpt-000002", "ckpt-000003",
                                                       "seed.json"]
    weights = out / "checkpoints" / "ckpt-000003" / "teachers_weights.npy"
    data = bytearray(weights.read_bytes())
    data[-9] ^= 0x40
    weights.write_bytes(bytes(data))
    ledger_before = (out / "ledger.json").read_bytes()
    with pytest.raises(CheckpointDamaged, match=f"{weights} is damaged: its SHA-256"):
        train(tiny_fmnist_dir, out)
    assert (out / "ledger.json").read_bytes() == ledger_before       # nothing spent
    os.rename(out / "checkpoints" / "ckpt-000003", tmp_path / "ckpt-000003.damaged")
    summary = train(tiny_fmnist_dir, out)
    assert summary.resumed_from_step == 2 and summary.lost_queries == BATCH


def test_crash_before_outputs_writes_them_on_resume(reference, tiny_fmnist_dir, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(Crash):
        train(tiny_fmnist_dir, out, fault_hook=crash_at("before_outputs", STEPS))
    summary = train(tiny_fmnist_dir, out)
    assert summary.steps == STEPS and summary.lost_queries == 0
    np.testing.assert_array_equal(samples(out), samples(reference))
    assert curve(out) == curve(reference)


PRIVACY_CHANGES = [
    ({"topagg": {"sigma": 30.0}}, "topagg.sigma (privacy-relevant): saved 20.0, now 30.0"),
    ({"topagg": {"topk": 40}}, "topagg.topk (privacy-relevant): saved 50, now 40"),
    ({"topagg": {"thresh": 0.5}}, "topagg.thresh (privacy-relevant): saved 0.25, now 0.5"),
    ({"train": {"num_teachers": 2}}, "train.num_teachers (privacy-relevant): saved 4, now 2"),
    ({"train": {"dataset": "mnist"}},
     "train.dataset (privacy-relevant): saved 'fashion_mnist', now 'mnist'"),
    ({"budget": {"delta": 1e-6}}, "budget.delta (privacy-relevant): saved 1e-05, now 1e-06"),
    ({"train": {"partition_seed": 9}},
     "train.partition_seed (privacy-relevant): saved 0, now 9"),
    ({"train": {"seed": 4}}, "train.seed (privacy-relevant): saved 3, now 4"),
    ({"train": {"z_dim": 9}}, "train.z_dim: saved 8, now 9"),
]


@pytest.mark.parametrize("change,message", PRIVACY_CHANGES,
                         ids=[m.split(":")[0] for _, m in PRIVACY_CHANGES])
def test_resume_with_other_settings_is_refused(reference, tiny_fmnist_dir, change, message):
    before = snapshot(reference)
    config = tiny_config(tiny_fmnist_dir, steps=STEPS).replace(**change)
    with pytest.raises(run.RunDirError) as error:
        train(tiny_fmnist_dir, reference, config=config)
    assert message in str(error.value)
    assert "--restart" in str(error.value)
    assert snapshot(reference) == before


def test_raising_the_budget_continues_the_run(reference, tiny_fmnist_dir, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(reference, out)
    more = tiny_config(tiny_fmnist_dir, steps=STEPS + 1)
    summary = train(tiny_fmnist_dir, out, config=more)
    assert summary.resumed_from_step == STEPS and summary.steps == STEPS + 1
    assert curve(out)[:STEPS] == curve(reference)


def test_restart_sets_the_old_run_aside(reference, tiny_fmnist_dir, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(reference, out)
    before = snapshot(out)
    changed = tiny_config(tiny_fmnist_dir, steps=2)
    summary = train(tiny_fmnist_dir, out, config=changed.replace(topagg={"sigma": 30.0}),
                    restart=True)
    assert summary.resumed_from_step is None
    aside = [p for p in os.listdir(tmp_path) if p.startswith("run.old-")]
    assert len(aside) == 1
    assert snapshot(tmp_path / aside[0]) == before


def test_non_finite_loss_stops_and_keeps_the_last_good_state(tiny_fmnist_dir, tmp_path,
                                                              monkeypatch):
    original = DataLens.train_step

    def poisoned(self):
        record = original(self)
        if record.step == 2:
            import dataclasses
            return dataclasses.replace(record, student_loss=float("nan"))
        return record

    monkeypatch.setattr(DataLens, "train_step", poisoned)
    out = tmp_path / "run"
    with pytest.raises(run.TrainingDiverged) as error:
        train(tiny_fmnist_dir, out)
    message = str(error.value)
    assert "step 3: the student's loss is not finite" in message
    assert f"counts all {3 * BATCH} queries" in message
    assert "ckpt-000002" in message and "no outputs were written" in message
    assert sorted(os.listdir(out / "checkpoints")) == ["PRIVATE", "ckpt-000001", "ckpt-000002",
                                                       "seed.json"]
    assert not (out / "samples.npz").exists() and not (out / "generator.keras").exists()
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["stop_reason"] == "non-finite student loss"
    assert privacy["queries"] == 3 * BATCH
    assert PrivacyJournal.load(out / "ledger.json").queries == 3 * BATCH


def test_missing_journal_with_spends_refuses_to_resume(tiny_fmnist_dir, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(Crash):
        train(tiny_fmnist_dir, out, fault_hook=crash_at("after_checkpoint", 1))
    os.remove(out / "ledger.json")
    with pytest.raises(run.RunDirError, match="privacy ledger is lost"):
        train(tiny_fmnist_dir, out)


def test_tampered_journal_refuses_to_resume(tiny_fmnist_dir, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(Crash):
        train(tiny_fmnist_dir, out, fault_hook=crash_at("after_checkpoint", 1))
    journal = json.loads((out / "ledger.json").read_text())
    journal["entries"] = []           # forget the spends
    (out / "ledger.json").write_text(json.dumps(journal))
    with pytest.raises(JournalError, match="inconsistent"):
        train(tiny_fmnist_dir, out)


def test_redone_steps_draw_fresh_noise(tiny_fmnist_dir, tmp_path, monkeypatch):
    """A step whose noisy release was lost is redone with new noise, never the same draw."""
    drawn = []
    original = SeededDraws.noise_seed

    def recording(self, attempt, step, round_index):
        seed = original(self, attempt, step, round_index)
        drawn.append((attempt, step, tuple(seed.numpy().tolist())))
        return seed

    monkeypatch.setattr(SeededDraws, "noise_seed", recording)
    out = tmp_path / "run"
    with pytest.raises(Crash):     # checkpoint after step 2; step index 2 released, then lost
        train(tiny_fmnist_dir, out, checkpoint_every=2, fault_hook=crash_at("after_step", 3))
    first = {step: seed for attempt, step, seed in drawn}
    assert [a for a, _, _ in drawn] == [0, 0, 0]
    drawn.clear()
    summary = train(tiny_fmnist_dir, out, checkpoint_every=2)
    assert summary.resumed_from_step == 2 and summary.lost_queries == BATCH
    assert drawn[0][:2] == (1, 2)
    assert drawn[0][2] != first[2]


def test_a_run_without_journal_but_with_spends_is_not_resumed(reference, tiny_fmnist_dir,
                                                             tmp_path):
    """A run directory of an older dclens (privacy.json, no ledger.json) is refused."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(reference, out)
    os.remove(out / "ledger.json")
    shutil.rmtree(out / "checkpoints")
    before = snapshot(out)
    with pytest.raises(run.RunDirError, match="older dclens without a privacy journal"):
        train(tiny_fmnist_dir, out)
    assert snapshot(out) == before


@pytest.mark.parametrize("killed_in", ["provenance", "write_run_readme", "mark_private",
                                       "write_seed", "journal"])
def test_a_run_killed_while_its_files_are_created_starts_again(reference, tiny_fmnist_dir,
                                                               tmp_path, monkeypatch,
                                                               killed_in):
    """A fresh run killed at any point of creating its files (config.json, README, PRIVATE
    markers, seed, journal) is run again by the same command: config.json is written
    before any other file, so the folder never holds files without it (before, a kill while
    config.json was being written left checkpoints/ alone, and the folder was refused as
    'not a dclens run')."""
    from dclens.runs import rundir

    def killed(*args, **kwargs):
        raise Crash(killed_in)
    if killed_in == "journal":
        monkeypatch.setattr(rundir.journal_lib.PrivacyJournal, "write", killed)
    else:
        monkeypatch.setattr(rundir, killed_in, killed)
    out = tmp_path / "run"
    with pytest.raises(Crash):
        train(tiny_fmnist_dir, out)
    monkeypatch.undo()
    summary = train(tiny_fmnist_dir, out)
    assert summary.steps == STEPS and summary.stop_reason == "budget"
    assert curve(out) == curve(reference)


def test_a_start_killed_before_its_config_begins_afresh(tiny_fmnist_dir, tmp_path):
    """A kill before config.json lands leaves at most its atomic write's temporary file and
    the teachers' banks being created (a paper-scale bank is written for minutes before
    config.json): nothing was spent or released, so the same command starts afresh."""
    out = tmp_path / "run"
    for bank in (out / "checkpoints" / "bank",
                 out / "checkpoints" / "shards" / "shard-001" / "bank"):
        bank.mkdir(parents=True)
        (bank / "weights.npy").write_bytes(b"half a bank")
    (out / ".tmp-k2j3l4.json").write_text('{"config": ')
    summary = train(tiny_fmnist_dir, out)
    assert summary.steps == STEPS and summary.resumed_from_step is None


@pytest.mark.parametrize("left", [["checkpoints", "seed.json"], ["checkpoints", "ckpt-000001"],
                                  ["checkpoints", "shards", "shard-001", "ckpt-000001"],
                                  ["samples.npz"]])
def test_a_folder_with_run_files_but_no_config_is_still_refused(tiny_fmnist_dir, tmp_path,
                                                                 left):
    """Only banks and temporary files mark a start that never began: a seed, a checkpoint
    or an output without config.json is a damaged run (or someone else's folder), never
    overwritten."""
    out = tmp_path / "run"
    path = out.joinpath(*left)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x")
    with pytest.raises(run.RunDirError, match="is not empty and is not a dclens run"):
        train(tiny_fmnist_dir, out)
    assert path.read_bytes() == b"x"
