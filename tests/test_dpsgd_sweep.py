"""The hyper-parameter sweep of private classifiers: grid parsing, expansion, the choice on
validation (never test), resume/read-back, and the CLI on a tiny real run."""

from __future__ import annotations

import json
import os

import pytest

from dclens.dpsgd import sweep
from dclens.dpsgd.config import DpsgdConfig
from conftest import load_script


def test_grid_parses_typed_values_and_quotes_bad_specs():
    grid = sweep.parse_grid(["learning_rate=0.5,2", "batch_size=16,32", "activation=relu,tanh"])
    assert grid == {"learning_rate": (0.5, 2.0), "batch_size": (16, 32),
                    "activation": ("relu", "tanh")}
    assert sweep.point_name({"activation": "tanh", "clip": 0.5}) == "activation-tanh_clip-0.5"
    assert isinstance(grid["batch_size"][0], int)
    for spec, match in ((["lr=1"], "'lr' cannot be varied"),
                        (["learning_rate"], "write NAME=V1,V2"),
                        (["learning_rate="], "write NAME=V1,V2"),
                        (["batch_size=1.5"], "must be an integer"),
                        (["clip=1,x"], "must be a number"),
                        (["clip=1,1"], "a value repeats"),
                        (["clip=1", "clip=2"], "given twice"),
                        (["sigma=1", "target_eps=2"], "both sigma and target_eps"),
                        (["method=gep"], "cannot be varied"),
                        (["activation=relu,sigmoid"], None)):
        if match is None:                 # parses; the config check names the bad value
            with pytest.raises(sweep.SweepError, match="activation = 'sigmoid'"):
                sweep.expand(DpsgdConfig(), sweep.parse_grid(spec))
            continue
        with pytest.raises(sweep.SweepError, match=match):
            sweep.parse_grid(spec)


def test_expand_is_every_combination_checked_as_a_config():
    base = DpsgdConfig(target_eps=2.0)
    points = sweep.expand(base, {"learning_rate": (0.5, 2.0), "clip": (1.0, 3.0, 9.0)})
    assert len(points) == 6
    assert {(c.learning_rate, c.clip) for _, c in points} == {
        (lr, c) for lr in (0.5, 2.0) for c in (1.0, 3.0, 9.0)}
    assert all(c.target_eps == 2.0 and c.method is base.method for _, c in points)
    assert sweep.point_name(points[0][0]) == "learning_rate-0.5_clip-1"
    (settings, given), = sweep.expand(base, {"sigma": (1.5,)})
    assert given.sigma == 1.5 and given.target_eps is None
    with pytest.raises(sweep.SweepError, match="learning_rate--1"):
        sweep.expand(base, {"learning_rate": (-1.0,)})


def _report(validation: float, test: float) -> dict:
    return {"accuracy": {"validation_at_chosen": validation, "test_at_chosen": test,
                         "chosen_epoch": 3.0, "test_final": test},
            "privacy": {"epsilon": {"epsilon": 1.0}, "sigma": 2.0}}


def test_the_choice_is_the_best_validation_never_the_best_test():
    summary = sweep.summarise([({"clip": 1.0}, _report(0.70, 0.90)),
                               ({"clip": 2.0}, _report(0.80, 0.60)),
                               ({"clip": 3.0}, _report(0.80, 0.95))])
    assert summary["chosen"]["settings"] == {"clip": 2.0}       # first of the tied best
    assert [row["test_at_chosen"] for row in summary["rows"]] == [0.90, 0.60, 0.95]
    assert "no epsilon here covers" in summary["privacy_of_the_choice"]
    with pytest.raises(sweep.SweepError, match="empty"):
        sweep.summarise([])


def test_a_repeated_sweep_reads_finished_points_back(tmp_path):
    calls = []

    def fake_train(config, run_dir, **_):
        calls.append(config.learning_rate)
        report = {"config": config.to_dict(), **_report(config.learning_rate / 10, 0.5)}
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "report.json"), "w") as handle:
            json.dump(report, handle)
        return report

    base, grid = DpsgdConfig(), {"learning_rate": (1.0, 4.0, 2.0)}
    first = sweep.run_sweep(base, grid, str(tmp_path / "root"), train=fake_train,
                            log=lambda line: None)
    assert calls == [1.0, 4.0, 2.0] and first["chosen"]["settings"] == {"learning_rate": 4.0}
    second = sweep.run_sweep(base, grid, str(tmp_path / "root"), train=fake_train,
                             log=lambda line: None)
    assert calls == [1.0, 4.0, 2.0]                           # nothing trained again
    assert second["rows"] == first["rows"]
    written = json.loads((tmp_path / "root" / "sweep.json").read_text())
    assert written["chosen"]["name"] == "learning_rate-4" and written["points_planned"] == 3
    # A point whose folder holds another config's report is trained (resume decides).
    sweep.run_sweep(base, {"learning_rate": (1.0,), "clip": (2.0,)}, str(tmp_path / "root"),
                    train=fake_train, log=lambda line: None)
    assert calls[-1] == 1.0 and len(calls) == 4


def test_cli_sweeps_two_real_tiny_runs(tiny_fmnist_dir, tmp_path, capsys):
    cli = load_script("dpsgd_sweep")
    argv = ["--method", "gm", "--data_dir", str(tiny_fmnist_dir), "--target_eps", "3",
            "--batch_size", "20", "--epochs", "1", "--validation", "20", "--seed", "3",
            "--grid", "learning_rate=0.5,2", "--root", str(tmp_path / "sweep"), "--quiet"]
    assert cli.main(argv) == 0
    assert "chosen on validation" in capsys.readouterr().out
    summary = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [row["name"] for row in summary["rows"]] == ["learning_rate-0.5",
                                                       "learning_rate-2"]
    for row in summary["rows"]:
        report = json.loads((tmp_path / "sweep" / row["name"] / "report.json").read_text())
        assert report["config"]["learning_rate"] == row["settings"]["learning_rate"]
        assert row["epsilon"] <= 3
    best = max(summary["rows"], key=lambda row: row["validation_at_chosen"])
    assert summary["chosen"]["validation_at_chosen"] == best["validation_at_chosen"]
    with pytest.raises(SystemExit):
        cli.main(argv[:-3] + ["--grid", "clip=0", "--root", str(tmp_path / "bad")])
    assert "clip = 0.0" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()                   # refused before any run
