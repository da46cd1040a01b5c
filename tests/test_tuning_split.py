"""The tuning split (issue 39's rule: hyper-parameters are never chosen on the private
records or the test set): the record sets are disjoint and exact, a private run reads
nothing of the tuning split (its outputs are bit-identical when the tuning split is
replaced adversarially), and a screening run never reads the test set."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dclens.data import splits
from dclens.datalens import build, resume, run
from dclens.datalens.config import TrainingRecords
from dclens.evaluation import evaluate, quality
from dclens.experiments import beyond, paper_rows, tables
from conftest import load_script, write_idx
from test_end_to_end import tiny_config
from test_reproduce import TINY_EVAL

reproduce_cli = load_script("reproduce")
main_cli = load_script("main")

PRIVATE = 80                                # the private records of the data sets below
TOTAL = PRIVATE + splits.TUNING_RECORDS


def _write_train(folder, images: np.ndarray, labels: np.ndarray) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_idx(folder / "train-images-idx3-ubyte.gz", images)
    write_idx(folder / "train-labels-idx1-ubyte.gz", labels)


def _indexed_images(count: int) -> tuple[np.ndarray, np.ndarray]:
    """Images that carry their own record index in two pixels (index = 256 a + b), and a
    class bar as in the tiny data set, so a generator has something to learn."""
    index = np.arange(count)
    images = np.random.default_rng(0).integers(0, 60, size=(count, 28, 28))
    labels = index % 10
    for i, label in enumerate(labels):
        images[i, 2 * label + 2:2 * label + 6, 4:24] = 230
    images[:, 27, 0], images[:, 27, 1] = index // 256, index % 256
    return images, labels


def _decoded_index(images) -> np.ndarray:
    pixels = np.rint(images[:, 27, :2, 0] * 255).astype(np.int64)
    return 256 * pixels[:, 0] + pixels[:, 1]


@pytest.fixture(scope="module")
def indexed_dir(tmp_path_factory):
    """A Fashion-MNIST-shaped training split of PRIVATE + 10,000 records, no test split."""
    root = tmp_path_factory.mktemp("indexed")
    _write_train(root / "fashion_mnist", *_indexed_images(TOTAL))
    return root


@pytest.fixture(scope="module")
def swapped_dir(tmp_path_factory):
    """The same private records; every record of the tuning split replaced by another
    image with another label (the adversary's choice)."""
    root = tmp_path_factory.mktemp("swapped")
    images, labels = _indexed_images(TOTAL)
    rng = np.random.default_rng(1)
    images[PRIVATE:] = rng.integers(0, 256, size=images[PRIVATE:].shape)
    labels[PRIVATE:] = (labels[PRIVATE:] + 1 + rng.integers(0, 9, TOTAL - PRIVATE)) % 10
    _write_train(root / "fashion_mnist", images, labels)
    return root


@pytest.mark.parametrize("total", [60_000, 162_770, splits.TUNING_RECORDS + 1])
def test_the_record_sets_are_disjoint_and_cover_the_training_split(total):
    private = splits.record_range(total, "private")
    tuning = splits.record_range(total, TrainingRecords.TUNING)
    holdout = splits.holdout_range(total)
    assert splits.record_range(total, "all") == range(total)
    assert len(tuning) == splits.TUNING_RECORDS - splits.TUNING_HOLDOUT_RECORDS
    assert len(holdout) == splits.TUNING_HOLDOUT_RECORDS
    parts = [set(private), set(tuning), set(holdout)]
    assert sum(len(p) for p in parts) == total
    assert set().union(*parts) == set(range(total))
    assert private.stop == tuning.start and tuning.stop == holdout.start


def test_a_training_split_too_small_or_an_unknown_name_is_refused_clearly():
    with pytest.raises(ValueError, match=r"has 10000 records.*--training_records all"):
        splits.record_range(10_000, "private")
    with pytest.raises(ValueError, match=r"one of \['all', 'private', 'tuning'\], got 'tune'"):
        splits.record_range(60_000, "tune")
    with pytest.raises(ValueError, match="has 500 records"):
        splits.holdout_range(500)


def test_each_set_loads_exactly_its_records(indexed_dir):
    for which, limit, expected in (("all", None, range(TOTAL)),
                                   ("private", None, range(PRIVATE)),
                                   ("tuning", None, range(PRIVATE, TOTAL - 2000)),
                                   ("tuning", 30, range(PRIVATE, PRIVATE + 30))):
        loaded = splits.load_training_records("fashion_mnist", indexed_dir, which,
                                              limit=limit, progress=False)
        np.testing.assert_array_equal(_decoded_index(loaded.images), np.array(expected))
    holdout = splits.load_tuning_holdout("fashion_mnist", indexed_dir)
    np.testing.assert_array_equal(_decoded_index(holdout.images),
                                  np.arange(TOTAL - 2000, TOTAL))
    assert "tuning holdout" in holdout.source
    # The evaluation's test set of a screening run is that holdout.
    test = evaluate.load_test("fashion_mnist", indexed_dir, test_set=evaluate.TUNING_HOLDOUT)
    np.testing.assert_array_equal(test.labels, holdout.labels)


def test_a_private_run_is_bit_identical_whatever_the_tuning_split_holds(
        indexed_dir, swapped_dir, tmp_path):
    """The adversarial swap: two data sets that agree on the private records only. A run
    on the private records gives the same bits on both (it reads nothing else); the full
    training splits differ, so the test could fail."""
    outputs = {}
    for name, root in (("indexed", indexed_dir), ("swapped", swapped_dir)):
        config = tiny_config(root, steps=2).replace(
            train={"max_records": None, "training_records": TrainingRecords.PRIVATE})
        assert len(build.load_training_data(config)) == PRIVATE
        run.train_run(config, str(tmp_path / name), progress=False, log=lambda _: None)
        with np.load(tmp_path / name / "samples.npz") as saved:
            outputs[name] = {key: saved[key].copy() for key in saved.files}
        outputs[name]["ledger"] = json.loads((tmp_path / name / "privacy.json").read_text())[
            "epsilon"]
    assert set(outputs["indexed"]) == set(outputs["swapped"]) and len(outputs["indexed"]) > 1
    for key, value in outputs["indexed"].items():
        np.testing.assert_array_equal(value, outputs["swapped"][key])
    full = [splits.load_training_records("fashion_mnist", root, "all", progress=False)
            for root in (indexed_dir, swapped_dir)]
    assert not np.array_equal(full[0].images, full[1].images)


@pytest.fixture(scope="module")
def screening_report(indexed_dir, tmp_path_factory):
    """A tiny screening reproduction (trained on the tuning split) on the data set without
    a test split. Without IS/FID: training the domain classifier on the 8,000 tuning
    records would take most of a minute; which records it learns from is tested through
    the settings (test_screening_settings_...)."""
    root = tmp_path_factory.mktemp("screening")
    argv = ["fashion_mnist", "--eps", "1", "--teachers", "4", "--max_records", "80",
            "--num_samples", "60", "--train_epochs", "1", "--seed", "3",
            "--teacher_chunk", "4", "--data_dir", str(indexed_dir),
            "--training_records", "tuning",
            "--out", str(root / "report"), "--run_dir", str(root / "run"),
            "--cache_dir", str(root / "cache"), "--quiet", "--no_quality", *TINY_EVAL]
    assert reproduce_cli.main(argv) == 0
    return root


def test_a_screening_reproduction_never_reads_the_test_set(indexed_dir, screening_report):
    """The data set has no test split at all: a screening run (trained on the tuning
    split) still evaluates, on the tuning holdout, the real reference included;
    an ordinary evaluation of the same samples cannot even start."""
    report = json.loads((screening_report / "report" / "report.json").read_text())
    assert report["name"].endswith("-tuning")
    assert report["config"]["train"]["training_records"] == "tuning"
    assert report["evaluation"]["settings"]["test_set"] == evaluate.TUNING_HOLDOUT
    assert report["evaluation"]["settings"]["domain"]["training_records"] == "tuning"
    assert any("tuning holdout" in d for d in report["deviations"])
    assert report["real_reference"] is not None
    with pytest.raises(Exception, match="could not find 'fashion_mnist' split 'test'"):
        evaluate.evaluate_path(str(screening_report / "run" / "samples.npz"),
                               "fashion_mnist", data_dir=str(indexed_dir),
                               settings=evaluate.EvalSettings(quality=False))


def test_the_beyond_readme_groups_runs_and_measures_each_lever_against_the_first(
        screening_report, tmp_path):
    """results/beyond/README.md from files: two paper-scale reports of one configuration
    (different seeds) make one row of 2 runs; a levers table's rows show their change in
    val against its first row; nothing there yet says so."""
    beyond_dir = tmp_path / "beyond"
    empty = beyond.render(str(tmp_path / "no-results"), str(beyond_dir))
    assert "No tuned configuration has run" in empty and "No levers table" in empty
    report = json.loads((screening_report / "report" / "report.json").read_text())
    for seed, run_name in ((3, "run-a"), (4, "run-b")):
        folder = beyond_dir / beyond.PAPER_SCALE_DIR / run_name
        folder.mkdir(parents=True)
        copy = json.loads(json.dumps(report))
        copy["options"]["seed"] = seed
        copy["evaluation"]["protocols"]["val"]["accuracy"] = 0.5 + seed / 100
        copy["deviations"] = [*copy["deviations"], f"starts from runs/merf/seed{seed}"]
        (folder / "report.json").write_text(json.dumps(copy))
    slower = beyond_dir / beyond.PAPER_SCALE_DIR / "run-c"       # scored with another lr
    slower.mkdir()
    copy = json.loads(json.dumps(report))
    copy["evaluation"]["settings"]["schedule"]["learning_rate"] = 1e-4
    copy["evaluation"]["settings"]["max_samples"] = 20000
    (slower / "report.json").write_text(json.dumps(copy))
    rows = beyond.tuned_rows(str(beyond_dir))
    assert [row["runs"] for row in rows] == [["run-a", "run-b"], ["run-c"]]
    fixture = " (classifier batch size 16, epochs 2)"      # the fixture's own schedule
    assert rows[0]["name"].endswith(fixture)
    assert rows[1]["name"] == rows[0]["name"].replace(fixture, (
        " (classifier batch size 16, epochs 2, learning rate 0.0001, 20000 samples)"))
    (slower / "report.json").unlink()
    slower.rmdir()
    rows = beyond.tuned_rows(str(beyond_dir))
    assert len(rows) == 1 and rows[0]["runs"] == ["run-a", "run-b"]
    n, mean, sd = rows[0]["val"]
    assert n == 2 and mean == pytest.approx(0.535) and sd == pytest.approx(0.00707, abs=1e-5)
    assert rows[0]["records"] == "tuning"
    # Each run's own deviation is named with its run, not the first run's for both.
    assert rows[0]["deviations"] == [*report["deviations"],
                                     "starts from runs/merf/seed3 (run-a)",
                                     "starts from runs/merf/seed4 (run-b)"]
    table_dir = beyond_dir / "levers-x"
    table_dir.mkdir()
    finished = {"status": "finished", "sen": 0.5, "label_agreement": 0.3, "epsilon": 28.1,
                "steps": 86}
    (table_dir / "table.json").write_text(json.dumps({"table": "levers", "rows": [
        {**finished, "row": "base", "changes": {}, "val": 0.40},
        {**finished, "row": "pld", "changes": {"conversion": "pld"}, "val": 0.47},
        {"row": "ema", "changes": {"generator_ema": 0.9}, "status": "not run"}]}))
    text = beyond.render(str(tmp_path / "no-results"), str(beyond_dir))
    assert "| pld | 0.4700 | +0.0700 |" in text and "| base | 0.4000 | +0.0000 |" in text
    assert "| ema | not run |" in text
    assert "0.5350 +- 0.0071 (2 runs)" in text


def test_the_screen_shows_val_rescored_with_the_paper_scale_rows_classifier_rate(
        screening_report, tmp_path):
    """A levers row's runs (its name and its -rep<r> repeats, not another row's) scored
    again by tune_classifier at the learning rate the paper-scale rows were scored with
    get their mean +- sd in their own column; with the default rate, or rates that differ
    between paper-scale runs, there is nothing to rescore with and no column."""
    beyond_dir = tmp_path / "beyond"
    report = json.loads((screening_report / "report" / "report.json").read_text())

    def paper_scale(run_name: str, rate: float) -> None:
        copy = json.loads(json.dumps(report))
        copy["evaluation"]["settings"]["schedule"]["learning_rate"] = rate
        (beyond_dir / beyond.PAPER_SCALE_DIR / run_name).mkdir(parents=True, exist_ok=True)
        (beyond_dir / beyond.PAPER_SCALE_DIR / run_name / "report.json").write_text(
            json.dumps(copy))

    def rescored(group: str, run_name: str, rate: float, val: float) -> None:
        folder = beyond_dir / group / run_name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"lr{rate:g}.json").write_text(json.dumps(
            {"run": run_name, "evaluation": {"protocols": {"val": {"accuracy": val}}}}))

    paper_scale("run-a", 1e-3)
    assert beyond.rescoring_rate(str(beyond_dir)) is None            # the default rate
    paper_scale("run-b", 3e-5)
    assert beyond.rescoring_rate(str(beyond_dir)) is None            # two rates
    (beyond_dir / beyond.PAPER_SCALE_DIR / "run-a" / "report.json").unlink()
    assert beyond.rescoring_rate(str(beyond_dir)) == 3e-5
    rescored("classifier/choice", "base", 3e-5, 0.60)
    rescored("classifier/choice", "base", 1e-3, 0.20)                # another rate
    rescored("classifier/confirmation", "base", 3e-5, 0.99)          # counted once
    rescored("rescored/more", "base-rep2", 3e-5, 0.56)
    rescored("rescored/more", "base-k300", 3e-5, 0.99)               # another row
    rescored("rescored/more", "ds4", 3e-5, 0.70)
    n, mean, sd = beyond.rescored_val(str(beyond_dir), "base", 3e-5)
    assert (n, mean, sd) == (2, pytest.approx(0.58), pytest.approx(0.02828, abs=1e-5))
    table_dir = beyond_dir / "levers-x"
    table_dir.mkdir()
    finished = {"status": "finished", "sen": 0.5, "label_agreement": 0.3, "epsilon": 28.1,
                "steps": 86, "changes": {}}
    (table_dir / "table.json").write_text(json.dumps({"table": "levers", "rows": [
        {**finished, "row": "the base", "name": "base", "val": 0.40},
        {**finished, "row": "four steps", "name": "ds4", "val": 0.30},
        {**finished, "row": "k300", "name": "base-k300-other", "val": 0.30}]}))
    text = beyond.render(str(tmp_path / "no-results"), str(beyond_dir))
    assert "| lever | `val` | change | `val`, classifier lr 3e-05 | `sen` |" in text
    assert "| the base | 0.4000 | +0.0000 | 0.580 +- 0.028 (2 runs) | 0.5000 |" in text
    assert "| four steps | 0.3000 | -0.1000 | 0.700 (1 run) | 0.5000 |" in text
    assert "| k300 | 0.3000 | -0.1000 | -- | 0.5000 |" in text
    paper_scale("run-a", 1e-3)
    assert "classifier lr" not in beyond.render(str(tmp_path / "no-results"), str(beyond_dir))


def test_a_report_written_under_paper_scale_regenerates_the_beyond_readme(
        indexed_dir, screening_report, tmp_path, capsys):
    """reproduce.py --out <beyond>/paper-scale/<run> rewrites <beyond>/README.md, whose
    paper-scale table then holds the run (here the screening run evaluated again)."""
    reproduce_cli = load_script("reproduce")
    beyond_dir = tmp_path / "results" / "beyond"
    out = beyond_dir / beyond.PAPER_SCALE_DIR / "run-x"
    argv = ["fashion_mnist", "--eps", "1", "--teachers", "4", "--max_records", "80",
            "--num_samples", "60", "--train_epochs", "1", "--seed", "3",
            "--teacher_chunk", "4", "--data_dir", str(indexed_dir),
            "--training_records", "tuning", "--skip_train", "--no_reference",
            "--out", str(out), "--run_dir", str(screening_report / "run"),
            "--cache_dir", str(screening_report / "cache"), "--quiet", "--no_quality",
            *TINY_EVAL]
    assert reproduce_cli.main(argv) == 0
    assert f"summary: {beyond_dir / 'README.md'}" in capsys.readouterr().out
    text = (beyond_dir / "README.md").read_text()
    assert "No tuned configuration has run" not in text
    assert "(run-x)" in text and "| tuning |" in text


def test_screening_settings_are_consistent_and_the_defaults_keep_their_cache_keys():
    settings = evaluate.EvalSettings()
    # Absent entries mean the defaults: the keys of caches written before the options.
    assert "test_set" not in settings.to_dict()
    assert "training_records" not in settings.domain.to_dict()
    screening = settings.for_screening()
    assert screening.to_dict()["test_set"] == "tuning_holdout"
    assert screening.domain.to_dict()["training_records"] == "tuning"
    assert screening.domain.key("fashion_mnist", None) != settings.domain.key(
        "fashion_mnist", None)
    with pytest.raises(evaluate.EvaluationError, match="use EvalSettings.for_screening"):
        evaluate.EvalSettings(test_set=evaluate.TUNING_HOLDOUT)
    with pytest.raises(evaluate.EvaluationError, match="test_set must be one of"):
        evaluate.EvalSettings(test_set="validation")
    with pytest.raises(ValueError, match="all training records or the tuning split"):
        quality.DomainSettings(training_records="private")
    # Without IS/FID no domain classifier is trained: the holdout alone is consistent.
    assert evaluate.EvalSettings(test_set=evaluate.TUNING_HOLDOUT, quality=False)


def test_options_name_the_records_and_a_run_cannot_resume_on_other_records():
    options = paper_rows.ReproduceOptions("fashion_mnist", 1, training_records="private")
    config, deviations = paper_rows.build_config(options)
    assert config.train.training_records is TrainingRecords.PRIVATE
    assert options.default_name() == "fashion_mnist-eps1-private"
    assert any("records 50000-59999 are the tuning split" in d for d in deviations)
    assert options.available_records == 50_000
    with pytest.raises(paper_rows.ReproduceError, match="max_records 9000 exceeds the 8000 "
                                                          "tuning training records"):
        paper_rows.ReproduceOptions("fashion_mnist", 1, training_records="tuning",
                                    max_records=9000)
    with pytest.raises(paper_rows.ReproduceError, match="unknown training_records 'test'"):
        paper_rows.ReproduceOptions("fashion_mnist", 1, training_records="test")
    saved = paper_rows.build_config(paper_rows.ReproduceOptions("fashion_mnist", 1))[0]
    differences = resume.resume_differences(saved.to_dict(), config)
    assert [name for name, *_ in differences] == ["train.training_records"]
    assert "train.training_records" in resume.PRIVACY_RELEVANT


def test_the_levers_table_runs_on_the_tuning_split_only(tmp_path):
    base = paper_rows.ReproduceOptions("fashion_mnist", 1, teachers=200, max_records=3000)
    with pytest.raises(paper_rows.ReproduceError, match="--training_records tuning"):
        tables.run_table("levers", tables.matched_noise(base), out_dir=str(tmp_path),
                         train=False, log=lambda _: None)
    screening = tables.matched_noise(
        paper_rows.ReproduceOptions("fashion_mnist", 1, teachers=200, max_records=3000,
                                    training_records="tuning"))
    summary = tables.run_table("levers", screening, out_dir=str(tmp_path), train=False,
                               log=lambda _: None)
    text = (tmp_path / "table.md").read_text()
    assert "Screening on the tuning split" in text and "records 58000-59999" in text
    assert all(row["status"] == "not run" for row in summary["rows"])


def test_the_training_flag_reaches_the_config():
    args = main_cli.build_parser().parse_args(["--training_records", "private"])
    _, config, _, _ = main_cli.resolve(args)
    assert config.train.training_records is TrainingRecords.PRIVATE
    with pytest.raises(SystemExit):
        main_cli.build_parser().parse_args(["--training_records", "holdout"])


def test_a_screening_domain_classifier_learns_from_the_tuning_split_only(indexed_dir,
                                                                          tmp_path):
    """IS/FID of a screening run: the domain classifier learns from the tuning records and
    measures itself on the tuning holdout (the data folder has no test split)."""
    from dclens.evaluation import classifiers

    settings = quality.DomainSettings(schedule=classifiers.Schedule(epochs=1, batch_size=64),
                                      train_limit=200, training_records="tuning")
    classifier = quality.domain_classifier("fashion_mnist", str(indexed_dir),
                                           settings=settings, cache_dir=str(tmp_path),
                                           log=lambda _: None)
    assert classifier.info["records"] == 200
    assert f"tuning records {PRIVATE}-{PRIVATE + 199}" in classifier.info["data_source"]
    assert "tuning holdout" in classifier.info["test_records"]
    assert "test_accuracy" in classifier.info


def test_a_groups_deviations_keep_the_shared_once_and_name_the_runs_of_the_rest():
    assert beyond.group_deviations(["a", "b", "c"], [["x", "y1", "z"], ["x", "y2", "z"],
                                                     ["x", "y1", "z"]]) == [
        "x", "y1 (a, c)", "z", "y2 (b)"]
    assert beyond.group_deviations(["a"], [["x", "y"]]) == ["x", "y"]
