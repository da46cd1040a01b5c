"""Real SIGKILLs: scripts/faults.py kills a training process and resumes it.

Three child processes per case (slow-ish: each imports TensorFlow): the uninterrupted
reference, the killed run, the resumed run.  The in-process crash tests are in
tests/test_resume.py; this file checks that a real ``kill -9`` changes nothing.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
from conftest import load_script

faults = load_script("faults")


@pytest.fixture(scope="module")
def reference_run(tiny_fmnist_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("faults") / "reference")
    started = time.perf_counter()
    assert faults.run_child(faults.main_argv(str(tiny_fmnist_dir), out)) == 0
    return faults.outcome(out), time.perf_counter() - started


@pytest.fixture(scope="module")
def reference(reference_run):
    return reference_run[0]


@pytest.mark.parametrize("kill_at,lost", [("after_spend:2", faults.BATCH),
                                          ("checkpoint_before_commit:3", faults.BATCH),
                                          ("after_checkpoint:2", 0)])
def test_sigkill_then_resume_matches_the_uninterrupted_run(reference, tiny_fmnist_dir,
                                                           tmp_path, kill_at, lost):
    out = str(tmp_path / "run")
    argv = faults.main_argv(str(tiny_fmnist_dir), out)
    assert faults.run_child(argv, kill_at=kill_at) == -signal.SIGKILL
    if kill_at.startswith("checkpoint_before_commit"):
        # The half-written checkpoint is on disk, under its temporary name only.
        assert any(n.startswith(".tmp-ckpt-000003") for n in os.listdir(f"{out}/checkpoints"))
        assert "ckpt-000003" not in os.listdir(f"{out}/checkpoints")
    assert faults.run_child(argv) == 0
    resumed = faults.outcome(out)
    assert resumed["lost_queries"] == lost
    assert faults.compare(reference, resumed) == []
    if lost == 0:
        assert resumed["samples_sha256"] == reference["samples_sha256"]


def test_sigkill_at_a_random_point(reference_run, tiny_fmnist_dir, tmp_path):
    """One trial of scripts/faults.py: a random kill point (or time), printed for replay."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"faults trial seed {seed}")
    reference, seconds = reference_run
    record = faults.trial(random.Random(seed), str(tmp_path), str(tiny_fmnist_dir), reference,
                          seconds, 0)
    assert record["resume_exit"] == 0, record
    assert record["failures"] == [], (seed, record)


def test_compare_catches_a_smaller_epsilon(reference):
    forged = dict(reference, curve=[dict(p, epsilon=p["epsilon"] * 0.9)
                                    for p in reference["curve"]])
    failures = faults.compare(reference, forged)
    assert failures and "< uninterrupted" in failures[0]
    assert faults.compare(reference, dict(reference, queries=reference["queries"] - 1))
    # A lost spend after the last completed step is in the ledger's total, not the curve.
    smaller = dict(reference, epsilon=reference["epsilon"] * 0.9)
    assert "the ledger's epsilon" in faults.compare(reference, smaller)[0]


def test_gswgan_sigkill_after_a_spend_resumes_without_under_counting(tiny_fmnist_dir,
                                                                      tmp_path):
    """GS-WGAN under a real kill -9 right after iteration 2's spend was journaled (the
    checkpoint holds 2 iterations): the resumed run counts that spend as lost, its
    epsilon is never below the uninterrupted run's, and its ledger adds up."""
    reference_dir = str(tmp_path / "reference")
    assert faults.run_child(faults.gswgan_argv(str(tiny_fmnist_dir), reference_dir),
                            method="gswgan") == 0
    reference = faults.gswgan_outcome(reference_dir)
    assert reference["steps"] == faults.STEPS and reference["lost_queries"] == 0
    out = str(tmp_path / "run")
    argv = faults.gswgan_argv(str(tiny_fmnist_dir), out)
    assert faults.run_child(argv, kill_at="after_spend:2", method="gswgan") == -signal.SIGKILL
    assert faults.run_child(argv, method="gswgan") == 0
    resumed = faults.gswgan_outcome(out)
    assert resumed["lost_queries"] == 1 and resumed["queries"] == faults.STEPS + 1
    assert faults.compare(reference, resumed) == []


class _TimedKillRng(random.Random):
    """Chooses a timed kill (random() < 0.25) at half the reference's time."""

    def random(self):
        return 0.1


def test_a_timed_kill_after_the_run_finished_is_checked_as_an_uninterrupted_run(
        reference, tmp_path, monkeypatch):
    """A fast run can finish before its timed kill: nothing was killed, so the trial is not a
    ledger mismatch -- but the finished run must still equal the reference exactly."""
    monkeypatch.setattr(faults, "run_child", lambda argv, **kill: 0)
    monkeypatch.setattr(faults, "outcome", lambda out: dict(reference))
    record = faults.trial(_TimedKillRng(), str(tmp_path), None, reference, 10.0, 0)
    assert "kill_after" in record and record["first_exit"] == 0
    assert record["killed"] is False and record["kill_landed"] is False
    assert record["failures"] == []
    different = dict(reference, samples_sha256="0" * 64)
    monkeypatch.setattr(faults, "outcome", lambda out: different)
    record = faults.trial(_TimedKillRng(), str(tmp_path), None, reference, 10.0, 1)
    assert record["failures"] == ["no spend was lost but the samples differ"]
