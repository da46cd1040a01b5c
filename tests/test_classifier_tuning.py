"""Choosing the downstream classifier's schedule on the tuning split (issue 39):
dclens/experiments/classifier_tuning.py and scripts/tune_classifier.py.

What must hold: only screening runs (trained on the tuning split) are read; the choice is
the highest mean ``val`` over the same runs, the earlier candidate on a tie; the scores
are on the tuning holdout; an interrupted call resumes from its records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dclens.common import export
from dclens.data import splits
from dclens.evaluation import classifiers, evaluate
from dclens.experiments import classifier_tuning
from dclens.experiments.classifier_tuning import Candidate, TuningError
from tests.conftest import write_idx

PRIVATE = 80


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A Fashion-MNIST-shaped training split with a tuning split (class bars + noise)."""
    root = tmp_path_factory.mktemp("tuning-data")
    folder = root / "fashion_mnist"
    folder.mkdir()
    count = PRIVATE + splits.TUNING_RECORDS
    labels = np.arange(count) % 10
    images = np.random.default_rng(0).integers(0, 60, size=(count, 28, 28))
    for i, label in enumerate(labels):
        images[i, 2 * label + 2:2 * label + 6, 4:24] = 230
    write_idx(folder / "train-images-idx3-ubyte.gz", images)
    write_idx(folder / "train-labels-idx1-ubyte.gz", labels)
    return root


def _run(folder, data_dir, records: str = "tuning", count: int = 100):
    """A finished run's folder: samples.npz (class bars) and config.json."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    labels = np.arange(count) % 10
    images = rng.uniform(0, 0.2, size=(count, 28, 28, 1)).astype(np.float32)
    for i, label in enumerate(labels):
        images[i, 2 * label + 2:2 * label + 6, 4:24] = 0.9
    export.write_samples_npz(folder / "samples.npz", images, labels)
    export.write_json(folder / "config.json", {"config": {"train": {
        "dataset": "fashion_mnist", "data_dir": str(data_dir), "training_records": records}}})
    return str(folder)


def _row(name: str, runs: list[str], val: list[float]) -> dict:
    return {"candidate": name, "runs": runs, "val": val,
            "val_mean": float(np.mean(val)), "sen": val, "val_epochs": [1] * len(val),
            "schedule": classifiers.DEFAULT_SCHEDULE.to_dict()}


def test_choose_takes_the_highest_mean_val_and_the_earlier_on_a_tie():
    runs = ["a", "b"]
    assert classifier_tuning.choose([_row("lr0.001", runs, [0.3, 0.5]),
                                     _row("lr0.0001", runs, [0.6, 0.4])]) == "lr0.0001"
    assert classifier_tuning.choose([_row("lr0.001", runs, [0.4, 0.4]),
                                     _row("lr0.0001", runs, [0.5, 0.3])]) == "lr0.001"
    assert classifier_tuning.choose([_row("x", runs, [0.1, 0.1]), _row("y", runs, [0.2, 0.1]),
                                     _row("z", runs, [0.9, 0.0])]) == "z"


def test_choose_refuses_candidates_scored_on_different_runs():
    with pytest.raises(TuningError, match="different runs"):
        classifier_tuning.choose([_row("x", ["a", "b"], [0.1, 0.2]),
                                  _row("y", ["a"], [0.9])])


def test_learning_rate_candidates_keep_the_order_and_the_rest_of_the_schedule():
    base = classifiers.Schedule(epochs=3)
    candidates = classifier_tuning.learning_rate_candidates([1e-3, 1e-4], base=base)
    assert [c.name for c in candidates] == ["lr0.001", "lr0.0001"]
    assert candidates[1].schedule == classifiers.Schedule(epochs=3, learning_rate=1e-4)
    with pytest.raises(TuningError, match="repeat"):
        classifier_tuning.learning_rate_candidates([1e-3, 1e-3])
    with pytest.raises(TuningError, match="name"):
        Candidate("a/b", base)


@pytest.mark.parametrize("records", ["all", "private", None])
def test_runs_not_trained_on_the_tuning_split_are_refused_by_name(tmp_path, data_dir, records):
    run = _run(tmp_path / "run", data_dir, records=records)
    with pytest.raises(TuningError, match=f"training_records {records!r}, not 'tuning'"):
        classifier_tuning.screening_run(run)
    with pytest.raises(TuningError, match="no samples.npz"):
        classifier_tuning.screening_run(str(tmp_path / "absent"))


def _extra_set(run: str, name: str = "samples-2"):
    """An extra sample set inside ``run`` (as ``main.py`` without --train writes one)."""
    folder = Path(run) / name
    folder.mkdir()
    shutil.copy(Path(run) / "samples.npz", folder / "samples.npz")
    return folder


def test_an_extra_sample_set_belongs_to_its_run(tmp_path, data_dir):
    """<run>/samples-<n> (a re-sampling of a finished run's generator) has no config.json
    of its own: it is read with its run's, so a screening run's set is scored on the
    tuning holdout and a private run's set stays refused for tuning."""
    from dclens.cli import evaluate as evaluate_cli
    from dclens.evaluation.synthetic_input import run_config_path, run_dir_config

    screen = _run(tmp_path / "screen", data_dir)
    extra = _extra_set(screen)
    assert run_config_path(extra / "samples.npz") == str(Path(screen) / "config.json")
    assert run_dir_config(extra)["train"]["training_records"] == "tuning"
    assert classifier_tuning.screening_run(str(extra)) == str(extra)
    assert classifier_tuning.run_label(str(extra)) == "screen-samples-2"
    assert classifier_tuning.run_label(screen) == "screen"
    private = _run(tmp_path / "private", data_dir, records="private")
    private_extra = _extra_set(private, "samples-3")
    with pytest.raises(TuningError, match="training_records 'private', not 'tuning'"):
        classifier_tuning.screening_run(str(private_extra))
    assert evaluate_cli._saved_run_config(str(private_extra / "samples.npz"))["train"][
        "training_records"] == "private"
    # Not an extra set: the run's own samples (n = 1), a name that is not a number, or a
    # samples-2 folder whose parent is not a run.
    for name in ("samples-1", "samples-two", "samples-"):
        assert run_dir_config(_extra_set(screen, name)) is None
    orphan = tmp_path / "loose" / "samples-2"
    orphan.mkdir(parents=True)
    assert run_dir_config(orphan) is None
    with pytest.raises(TuningError, match="training_records None, not 'tuning'"):
        classifier_tuning.screening_run(str(_extra_set(_run(tmp_path / "x", data_dir),
                                                       "samples-1")))
    # A set with a config.json of its own is read with that one.
    export.write_json(extra / "config.json", {"config": {"train": {
        "dataset": "fashion_mnist", "training_records": "all"}}})
    assert run_dir_config(extra)["train"]["training_records"] == "all"


def test_candidates_are_scored_on_the_tuning_holdout_and_resume_from_their_records(
        tmp_path, data_dir, monkeypatch):
    runs = [_run(tmp_path / "runs" / name, data_dir) for name in ("r1", "r2")]
    candidates = classifier_tuning.learning_rate_candidates(
        [1e-3, 1e-2], base=classifiers.Schedule(epochs=2, batch_size=32))
    out = str(tmp_path / "out")
    records = classifier_tuning.evaluate_candidates(runs, candidates, out_dir=out,
                                                    log=lambda line: None)
    assert [(r["run"], r["candidate"]) for r in records] == [
        ("r1", "lr0.001"), ("r1", "lr0.01"), ("r2", "lr0.001"), ("r2", "lr0.01")]
    for record in records:
        settings = record["evaluation"]["settings"]
        assert settings["test_set"] == evaluate.TUNING_HOLDOUT
        assert record["evaluation"]["test"]["samples"] == splits.TUNING_HOLDOUT_RECORDS
        assert settings["schedule"]["learning_rate"] == float(record["candidate"][2:])
    summary = classifier_tuning.summarise(records, candidates)
    rows = {row["candidate"]: row for row in summary["rows"]}
    best = max(rows.values(), key=lambda row: row["val_mean"])["candidate"]
    assert summary["chosen"] == best
    assert summary["samples_per_run"] == [100]
    classifier_tuning.write_summary(summary, out)
    readme = (tmp_path / "out" / "README.md").read_text()
    assert f"| {best} (chosen) |" in readme
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["chosen"] == best

    def must_not_train(*args, **kwargs):
        raise AssertionError("a record on disk was evaluated again")

    monkeypatch.setattr(evaluate, "evaluate_path", must_not_train)
    again = classifier_tuning.evaluate_candidates(runs, candidates, out_dir=out,
                                                  log=lambda line: None)
    assert [r["evaluation"]["protocols"] for r in again] == [
        r["evaluation"]["protocols"] for r in records]
    other = classifier_tuning.learning_rate_candidates(
        [1e-3], base=classifiers.Schedule(epochs=3, batch_size=32))
    with pytest.raises(TuningError, match="other evaluation settings"):
        classifier_tuning.evaluate_candidates(runs, other, out_dir=out, log=lambda line: None)


def test_the_cli_refuses_a_private_run_and_a_bad_rate_by_name(tmp_path, data_dir, capsys):
    from dclens.cli import tune_classifier

    private = _run(tmp_path / "private", data_dir, records="private")
    assert tune_classifier.main([private, "--out", str(tmp_path / "o")]) == 2
    assert "training_records 'private', not 'tuning'" in capsys.readouterr().err
    screening = _run(tmp_path / "screen", data_dir)
    assert tune_classifier.main([screening, "--learning_rates", "0", "--out",
                                 str(tmp_path / "o")]) == 2
    assert "--learning_rates must be finite numbers > 0, got 0.0" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_beyond_readme_shows_each_classifier_choice(tmp_path):
    from dclens.experiments import beyond

    beyond_dir = tmp_path / "beyond"
    assert "downstream classifier" not in beyond.render(str(tmp_path / "none"),
                                                        str(beyond_dir))
    candidates = classifier_tuning.learning_rate_candidates([1e-3, 1e-4])
    records = [{"run": run, "candidate": c.name, "evaluation": {"protocols": {
        "val": {"accuracy": val, "epoch": 20}, "sen": {"accuracy": val + 0.1, "epoch": 2}}}}
        for run, vals in (("a", (0.30, 0.61)), ("b", (0.40, 0.55)))
        for c, val in zip(candidates, vals)]
    summary = classifier_tuning.summarise(records, candidates)
    assert summary["chosen"] == "lr0.0001"
    classifier_tuning.write_summary(summary, str(beyond_dir / beyond.CLASSIFIER_DIR / "set1"))
    text = beyond.render(str(tmp_path / "none"), str(beyond_dir))
    assert "`classifier/set1` ([table](./classifier/set1/README.md), 2 runs: `a`, `b`)" in text
    assert "| 0.001 | 0.350 +- 0.071 (2 runs) | 0.450 +- 0.071 (2 runs) |  |" in text
    assert "| 0.0001 | 0.580 +- 0.042 (2 runs) | 0.680 +- 0.042 (2 runs) | yes |" in text


def test_the_screen_epoch_profile_is_the_mean_over_screening_reports(tmp_path):
    from dclens.experiments import beyond

    assert beyond.screen_epoch_profile(str(tmp_path)) is None
    curves = {"r1": ([0.6, 0.5] + [0.4] * 18, 0.9, 0.40),
              "r2": ([0.4, 0.3] + [0.2] * 18, 0.8, 0.20)}
    for run, (test, synthetic, val) in curves.items():
        export.write_json(tmp_path / "levers-x" / run / "report.json", {"evaluation": {
            "curves": {"test_accuracy": test, "val_accuracy": [0.5] * 19 + [synthetic]},
            "protocols": {"val": {"accuracy": val}}}})
    (tmp_path / "levers-x" / "table.json").write_text("{}")
    profile = beyond.screen_epoch_profile(str(tmp_path))
    assert profile["runs"] == 2
    assert profile["val_mean"] == pytest.approx(0.30)
    assert profile["synthetic_last"] == (0.8, 0.9)
    assert profile["by_epoch"] == pytest.approx({1: 0.5, 2: 0.4, 5: 0.3, 10: 0.3, 20: 0.3})


def test_the_cli_writes_its_table_and_the_beyond_readme(tmp_path, data_dir, capsys):
    from dclens.cli import tune_classifier

    run = _run(tmp_path / "runs" / "screen", data_dir)
    out = tmp_path / "beyond" / "classifier" / "set1"
    assert tune_classifier.main([run, "--learning_rates", "1e-3", "1e-2", "--epochs", "1",
                                 "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    chosen = json.loads((out / "summary.json").read_text())["chosen"]
    assert f"chosen: {chosen} ->" in printed
    assert [p.name for p in sorted((out / "screen").iterdir())] == ["lr0.001.json",
                                                                   "lr0.01.json"]
    assert f"| {chosen} (chosen) |" in (out / "README.md").read_text()
    assert "`classifier/set1`" in (tmp_path / "beyond" / "README.md").read_text()
    (tmp_path / "beyond" / "README.md").unlink()
    rescored = tmp_path / "beyond" / "rescored" / "group1"
    assert tune_classifier.main([run, "--learning_rates", "1e-3", "--epochs", "1",
                                 "--quiet", "--out", str(rescored)]) == 0
    assert (rescored / "screen" / "lr0.001.json").is_file()
    assert f"summary: {tmp_path / 'beyond' / 'README.md'}" in capsys.readouterr().out
    assert (tmp_path / "beyond" / "README.md").is_file()
