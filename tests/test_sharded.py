"""Sharded teachers (dclens/datalens/sharded.py, issue 17): a run whose teachers live in shard
workers -- Ray actors, or the same workers in-process -- is bit for bit the in-process run
(samples, epsilon curve, ledger); only sums over a shard's teachers reach the driver; a
worker failure stops the run before anything of the round is released, with every spend
kept and a resume that counts the lost ones; bad input is refused with nothing written."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dclens.datalens import run, sharded
from dclens.datalens.config import (Aggregation, BudgetConfig, DataLensConfig, FakeRendering,
                           TopAggConfig, TrainConfig)
from dclens.runs.journal import PrivacyJournal
from dclens.datalens.shards import ShardPlanError

TEACHERS, CHUNK, BATCH, G_STEP = 8, 2, 6, 2


def _config(data_dir, *, epochs: int = 2, **train) -> DataLensConfig:
    return DataLensConfig(
        train=TrainConfig(dataset="fashion_mnist", data_dir=str(data_dir),
                          num_teachers=TEACHERS, batch_size=BATCH, d_step=1,
                          pretrain_teacher=2, z_dim=8, teacher_chunk=CHUNK, epochs=epochs,
                          num_samples=20, seed=3, g_step=G_STEP, **train),
        topagg=TopAggConfig(topk=40, sigma=5.0, thresh=0.2, max_grad=10.0,
                            method=Aggregation.TOPK_STOCHASTIC_SIGN),
        budget=BudgetConfig(max_eps=1e6))


def _quiet(message: str) -> None:
    del message


def _train(config, out, **kwargs):
    return run.train_run(config, str(out), progress=False, log=_quiet, **kwargs)


def _outputs(out) -> dict:
    samples = np.load(os.path.join(out, "samples.npz"))
    with open(os.path.join(out, "privacy.json")) as stream:
        privacy = json.load(stream)
    return {"x": samples["x"], "y": samples["y"], "curve": privacy["epsilon_per_step"],
            "queries": privacy["queries"], "ledger": privacy["ledger"]}


def _assert_same_run(got: dict, want: dict) -> None:
    np.testing.assert_array_equal(got["x"], want["x"])
    np.testing.assert_array_equal(got["y"], want["y"])
    assert got["curve"] == want["curve"]
    assert got["queries"] == want["queries"]
    assert got["ledger"] == want["ledger"]


@pytest.fixture(scope="module")
def unsharded(tiny_fmnist_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("unsharded") / "run"
    _train(_config(tiny_fmnist_dir), out)
    return _outputs(out)


@pytest.mark.parametrize("shards", [1, 3])
def test_inprocess_workers_give_the_unsharded_run_bit_for_bit(unsharded, tiny_fmnist_dir,
                                                              tmp_path, shards):
    # 3 shards of 8 teachers in chunks of 2: 4, 2 and 2 teachers (uneven on purpose).
    _train(_config(tiny_fmnist_dir), tmp_path / "run", shards=shards,
           shard_backend="inprocess")
    _assert_same_run(_outputs(tmp_path / "run"), unsharded)


def test_two_ray_actors_give_the_unsharded_run_bit_for_bit(unsharded, tiny_fmnist_dir,
                                                           tmp_path):
    out = tmp_path / "run"
    _train(_config(tiny_fmnist_dir), out, shards=2)      # a local Ray cluster, 2 actors
    _assert_same_run(_outputs(out), unsharded)
    shard_dirs = sorted(os.listdir(out / "checkpoints" / sharded.SHARDS_FOLDER))
    assert shard_dirs == ["shard-000", "shard-001"]      # each actor wrote its own


class _SpyBackend(sharded.InProcessBackend):
    """In-process workers that record the arrays of every call and every result."""

    def __init__(self, options):
        super().__init__(options)
        self.calls: list[tuple[str, tuple, object]] = []

    def submit(self, worker, method, *args):
        def call():
            result = getattr(worker, method)(*args)
            self.calls.append((method, args, result))
            return result
        return call


def _arrays(value) -> list[np.ndarray]:
    if isinstance(value, np.ndarray):
        return [value]
    if isinstance(value, dict):
        return [a for v in value.values() for a in _arrays(v)]
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in _arrays(v)]
    return []


def test_only_shard_sums_and_public_inputs_cross_the_boundary(tiny_fmnist_dir, tmp_path,
                                                              monkeypatch):
    spies = []

    def spy(options):
        spies.append(_SpyBackend(options))
        return spies[-1]

    monkeypatch.setitem(sharded.BACKENDS, "inprocess", spy)
    _train(_config(tiny_fmnist_dir, epochs=1), tmp_path / "run", shards=2,
           shard_backend="inprocess")
    calls = spies[0].calls
    voted = [c for c in calls if c[0] in ("train", "vote")]
    assert len(voted) == 2 * (2 * G_STEP)        # 2 steps x 2 rounds x 2 shards
    d = 28 * 28
    for method, args, result in voted:
        # Sent: the class grid [K, B, 28, 28, 1], a query batch, sign keys (int64 [2]).
        for array in _arrays(args):
            assert array.shape in {(10, BATCH, 28, 28, 1), (BATCH, 28, 28, 1), (BATCH, 10),
                                   (2,)}, (method, array.shape)
        # Received: one int32 [B, D] sum per shard (and the sum and count of its teachers'
        # losses: no per-teacher value).
        votes = result[2] if method == "train" else result
        assert votes.shape == (BATCH, d) and votes.dtype == np.int32
        if method == "train":
            assert isinstance(result[0], float) and result[1] == TEACHERS // 2
    # No record of the training data is ever sent to the driver or back.
    assert not any(a.dtype == np.uint8 for c in calls for a in _arrays(c[1]) + _arrays(c[2]))


def test_a_failing_worker_stops_before_release_and_the_resume_counts_the_lost_spends(
        unsharded, tiny_fmnist_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    original = sharded.ShardWorker.vote
    calls = {"n": 0}

    def dies_on_third_vote(self, *args):
        calls["n"] += 1
        if calls["n"] == 3:       # step 1, round 1, shard 0: round 0 of step 1 is spent
            raise RuntimeError("worker process died")
        return original(self, *args)

    monkeypatch.setattr(sharded.ShardWorker, "vote", dies_on_third_vote)
    with pytest.raises(sharded.ShardError, match="resume from the last checkpoint"):
        _train(_config(tiny_fmnist_dir), out, shards=2, shard_backend="inprocess",
               checkpoint_every=1)
    journal = PrivacyJournal.load(str(out / "ledger.json"))
    # Steps 0 (2 rounds) and round 0 of step 1 were journaled before their noise.
    assert journal.queries == 3 * BATCH
    monkeypatch.setattr(sharded.ShardWorker, "vote", original)
    summary = _train(_config(tiny_fmnist_dir), out, shards=2, shard_backend="inprocess",
                     checkpoint_every=1)
    assert summary.lost_queries == BATCH                 # step 1 round 0, redone
    assert summary.queries == unsharded["queries"] + BATCH
    assert summary.steps == 4


def test_a_paused_sharded_run_checkpoints_every_shard_and_resumes_bit_for_bit(
        unsharded, tiny_fmnist_dir, tmp_path):
    """A stop asked before step 3 (no checkpoint due: every 10 steps): the driver and both
    shards checkpoint step 3 and the resume is the unsharded run, nothing lost."""
    out = tmp_path / "run"
    reads = iter(range(100))
    with pytest.raises(run.RunPaused):
        _train(_config(tiny_fmnist_dir), out, shards=2, shard_backend="inprocess",
               checkpoint_every=10, should_stop=lambda: next(reads) >= 3)
    assert "ckpt-000003" in os.listdir(out / "checkpoints")
    shard_folders = os.listdir(out / "checkpoints" / sharded.SHARDS_FOLDER)
    assert len(shard_folders) == 2
    summary = _train(_config(tiny_fmnist_dir), out, shards=2, shard_backend="inprocess",
                     checkpoint_every=10)
    assert summary.resumed_from_step == 3 and summary.lost_queries == 0
    _assert_same_run(_outputs(out), unsharded)


def test_resume_with_another_shard_count_is_refused_by_name(tiny_fmnist_dir, tmp_path):
    out = tmp_path / "run"
    _train(_config(tiny_fmnist_dir, epochs=1), out, shards=2, shard_backend="inprocess")
    for other, expected in ((None, "no --shards"), (3, "--shards 3")):
        with pytest.raises(run.RunDirError, match="trained with --shards 2") as error:
            _train(_config(tiny_fmnist_dir, epochs=2), out, shards=other,
                   shard_backend="inprocess")
        assert expected in str(error.value)


def test_in_process_run_cannot_resume_sharded(tiny_fmnist_dir, tmp_path):
    out = tmp_path / "run"
    _train(_config(tiny_fmnist_dir, epochs=1), out)
    with pytest.raises(run.RunDirError, match=r"no --shards \(in-process teachers\)"):
        _train(_config(tiny_fmnist_dir, epochs=2), out, shards=2, shard_backend="inprocess")


def test_more_shards_than_teachers_is_refused_before_anything_is_written(tiny_fmnist_dir,
                                                                         tmp_path):
    with pytest.raises(ShardPlanError, match=f"--shards 9 is more than the {TEACHERS} "
                                             "teachers"):
        _train(_config(tiny_fmnist_dir), tmp_path / "run", shards=9,
               shard_backend="inprocess")
    assert not (tmp_path / "run").exists()


def test_unreachable_ray_address_is_refused_before_anything_is_written(tiny_fmnist_dir,
                                                                       tmp_path):
    with pytest.raises(sharded.ShardError, match="cannot reach the Ray cluster at "
                                                 "--ray_address '127.0.0.1:1'.*ray start"):
        _train(_config(tiny_fmnist_dir), tmp_path / "run", shards=2,
               ray_address="127.0.0.1:1")
    assert not (tmp_path / "run").exists()


def test_a_node_without_the_dataset_is_a_clear_error(tiny_fmnist_dir, tmp_path):
    # The driver's data is found; the worker's config points at an empty folder.
    empty = tmp_path / "no-data"
    empty.mkdir()
    options = sharded.ShardOptions(2, str(tmp_path / "ckpt"), backend="inprocess")
    with pytest.raises(Exception, match=str(empty)):
        sharded.ShardWorker(sharded.ShardSetup(
            config=_config(empty).to_dict(), shard=sharded.Shard(0, 0, 4), total=TEACHERS,
            bank_seed=1, checkpoint_dir=options.checkpoint_dir))


def test_teacher_label_rendering_is_refused_with_shards(tiny_fmnist_dir, tmp_path):
    config = _config(tiny_fmnist_dir, fake_rendering=FakeRendering.TEACHER_LABELS)
    with pytest.raises(sharded.ShardError, match="class_grid"):
        _train(config, tmp_path / "run", shards=2, shard_backend="inprocess")
    assert not (tmp_path / "run").exists()
