"""Real SIGKILLs: scripts/faults.py kills a training process and resumes it.

Three child processes per case (slow-ish: each imports TensorFlow): the uninterrupted
reference, the killed run, the resumed run.  The in-process crash tests are in
tests/test_resume.py; this file checks that a real ``kill -9`` changes nothing.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import signal

import pytest

_PATH = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "faults.py"
_spec = importlib.util.spec_from_file_location("dclens_faults", _PATH)
faults = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(faults)


@pytest.fixture(scope="module")
def reference(tiny_fmnist_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("faults") / "reference")
    assert faults.run_child(faults.main_argv(str(tiny_fmnist_dir), out)) == 0
    return faults.outcome(out)


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


def test_compare_catches_a_smaller_epsilon(reference):
    forged = dict(reference, curve=[dict(p, epsilon=p["epsilon"] * 0.9)
                                    for p in reference["curve"]])
    failures = faults.compare(reference, forged)
    assert failures and "< uninterrupted" in failures[0]
    assert faults.compare(reference, dict(reference, queries=reference["queries"] - 1))
