"""The private-classifier results table: publishing runs and sweeps, grouping by method,
budget and settings, mean +- sd over runs, and the hand-written text left alone."""

from __future__ import annotations

import json

import pytest

from dclens.dpsgd import report
from dclens.dpsgd.config import DpsgdConfig
from conftest import load_script


def _write_run(folder, *, test, validation=0.5, seed=None, **config):
    values = DpsgdConfig(seed=seed, **config).to_dict()
    body = {"method": values["method"], "config": values,
            "accuracy": {"test_at_chosen": test, "validation_at_chosen": validation,
                         "test_final": test - 0.01, "chosen_epoch": 3.0},
            "privacy": {"epsilon": {"epsilon": 0.999}, "sigma": 1.7}}
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps(body))
    return folder


def test_runs_group_by_method_budget_and_settings_with_mean_and_sd(tmp_path):
    results = tmp_path / "results"
    for name, test, lr in (("a", 0.70, 3.0), ("b", 0.80, 3.0), ("c", 0.60, 0.5)):
        report.publish_run(str(_write_run(tmp_path / name, test=test, learning_rate=lr)),
                           str(results))
    report.publish_run(str(_write_run(tmp_path / "t", test=0.5, method="topagg", seed=4)),
                       str(results))
    table = report.render(report.collect(str(results)))
    lines = [line for line in table.splitlines() if line.startswith("| gm")]
    assert len(lines) == 2
    lr3 = next(line for line in lines if "lr 3" in line)
    assert "0.7500 +- 0.0707 (2 runs)" in lr3 and "`a`, `b`" in lr3
    assert "0.6000 (1 run)" in next(line for line in lines if "lr 0.5" in line)
    assert "| topagg | eps 1 | defaults | 1 | 0.5000 (1 run)" in table    # its own lr default
    assert "`t` (seeded)" in table


def test_publishing_refuses_unfinished_runs_and_overwrites(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(report.ReportError, match="has not finished"):
        report.publish_run(str(tmp_path / "empty"), str(tmp_path / "results"))
    run = _write_run(tmp_path / "r", test=0.7)
    first = report.publish_run(str(run), str(tmp_path / "results"))
    assert report.publish_run(str(run), str(tmp_path / "results")) == first   # same: fine
    other = _write_run(tmp_path / "x" / "r", test=0.1)
    with pytest.raises(report.ReportError, match="exists with other content"):
        report.publish_run(str(other), str(tmp_path / "results"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "report.json").write_text("{}")
    with pytest.raises(report.ReportError, match="not a private-classifier report"):
        report.publish_run(str(tmp_path / "bad"), str(tmp_path / "results"))


def test_a_sweep_is_published_with_its_points_and_the_readme_text_is_kept(tmp_path):
    from dclens.dpsgd import sweep

    root = tmp_path / "sweep"
    pairs = []
    for lr, validation in ((0.5, 0.6), (2.0, 0.8)):
        settings = {"learning_rate": lr}
        folder = _write_run(root / sweep.point_name(settings), test=validation - 0.02,
                            validation=validation, learning_rate=lr)
        pairs.append((settings, json.loads((folder / "report.json").read_text())))
    summary = {"base": DpsgdConfig().to_dict(), "points_planned": 2, **sweep.summarise(pairs)}
    (root / "sweep.json").write_text(json.dumps(summary))
    results = tmp_path / "results"
    results.mkdir()
    (results / "README.md").write_text("# Hand-written\n\nkept\n")
    cli = load_script("dpsgd_report")
    assert cli.main(["add_sweep", str(root), "--results", str(results)]) == 0
    assert sorted(p.name for p in results.glob("*.json")) == [
        "sweep-learning_rate-0.5.json", "sweep-learning_rate-2.json"]
    text = (results / "README.md").read_text()
    assert text.startswith("# Hand-written\n\nkept\n") and report.BEGIN_MARK in text
    assert "Chosen on validation: **learning_rate-2**" in text
    assert "`sweep-learning_rate-2` (chosen on validation in its sweep)" in text
    assert "`sweep-learning_rate-0.5` (chosen" not in text
    assert "no epsilon here covers" in text
    assert cli.main(["render", "--results", str(results)]) == 0
    assert (results / "README.md").read_text() == text                  # idempotent

    # The grid extended under the same root: the grown sweep replaces its published copy.
    settings = {"learning_rate": 4.0}
    folder = _write_run(root / sweep.point_name(settings), test=0.7, validation=0.9,
                        learning_rate=4.0)
    pairs.append((settings, json.loads((folder / "report.json").read_text())))
    grown = {"base": DpsgdConfig().to_dict(), "points_planned": 3, **sweep.summarise(pairs)}
    (root / "sweep.json").write_text(json.dumps(grown))
    assert cli.main(["add_sweep", str(root), "--results", str(results)]) == 0
    assert "(gm, 3 of 3 points)" in (results / "README.md").read_text()
    assert "Chosen on validation: **learning_rate-4**" in (results / "README.md").read_text()
    # A different sweep under the same name (other base settings) is still refused.
    other = dict(grown, base=dict(grown["base"], momentum=0.5))
    (root / "sweep.json").write_text(json.dumps(other))
    assert cli.main(["add_sweep", str(root), "--results", str(results)]) == 2


def test_cli_errors_name_the_problem(tmp_path, capsys):
    cli = load_script("dpsgd_report")
    with pytest.raises(SystemExit):
        cli.main(["render", "x"])
    assert "render takes no folders" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["add"])
    assert "needs at least one folder" in capsys.readouterr().err
    assert cli.main(["add", str(tmp_path / "nowhere"), "--results", str(tmp_path)]) == 2
    assert "has not finished" in capsys.readouterr().err
