"""Whole runs side by side (dclens/parity/whole_run*.py): the configuration's checks, the
statistics of the comparison against an independent computation, and the whole path end to
end at a tiny size (one run per side, three steps) through the command-line tool.

The end-to-end test needs the authors' repository beside the checkout and the real
Fashion-MNIST (as tests/test_side_by_side.py); without them it is skipped with the reason.
"""

import dataclasses
import json
import math
import os
import pathlib

import numpy as np
import pytest
from scipy import stats

from dclens.common import export
from dclens.datalens import build, networks
from dclens.privacy import accounting
from dclens.parity import whole_run, whole_run_report, whole_run_study
from dclens.parity.config import SideBySideError

from test_side_by_side import AUTHORS, needs_authors

TINY = dict(teachers=4, records=15, batch_size=15, topk=50, sigma=40.0, thresh=0.5,
            d_step=2, pretrain_teacher=3, z_dim=10)


# --------------------------------------------------------------------------- config
def test_the_budget_decides_the_steps_as_the_ledger_does():
    """planned_steps (dp_accounting's step search) against spending TopAgg's event one
    step at a time in the ledger the runs use, as DataLens.within_budget does."""
    config = whole_run.WholeRunConfig.with_budget(15.0, samples=100, **TINY)
    lens_config = config.dclens_config()
    event = build.build_topagg(lens_config, networks.ImageShape(28, 28, 1, 10)).event(
        config.lockstep.batch)
    ledger = accounting.PrivacyLedger(delta=config.lockstep.delta,
                                      conversion=accounting.Conversion.CLASSIC,
                                      orders=accounting.classic_orders(200))
    steps = 0
    while ledger.epsilon_after_event(event).epsilon <= 15.0:
        ledger.spend(event)
        steps += 1
    assert config.lockstep.steps == steps == 3
    assert lens_config.budget.max_eps == 15.0
    assert lens_config.train.epochs == config.their_epochs == 4   # one more than the budget


@pytest.mark.parametrize("change, message", [
    (dict(batch_size=5), "batch_size = records"),
    (dict(sigma=400.0), None),
])
def test_whole_run_configs_that_cannot_run_are_refused(change, message):
    if message is None:      # a budget that allows no step at all
        with pytest.raises(SideBySideError, match="allows no step"):
            whole_run.WholeRunConfig.with_budget(0.5, samples=100, **{**TINY, **change})
        return
    with pytest.raises(SideBySideError, match=message):
        whole_run.WholeRunConfig.with_budget(15.0, samples=100, **{**TINY, **change})


def test_a_config_whose_steps_disagree_with_its_budget_is_refused():
    config = whole_run.WholeRunConfig.with_budget(15.0, samples=100, **TINY)
    with pytest.raises(SideBySideError, match="allows 3 steps"):
        whole_run.WholeRunConfig(dataclasses.replace(config.lockstep, steps=4), 15.0, 100)


def test_the_noise_matched_scale_is_the_papers_noise_relative_to_the_votes():
    config = whole_run.WholeRunConfig.noise_matched(200, eps=1)
    assert config.lockstep.sigma == pytest.approx(5000 * 200 / 4000)
    assert config.lockstep.steps == 86                 # the paper's eps = 1 steps
    assert config.lockstep.topk == 200 and config.lockstep.thresh == 0.9


def test_run_seeds_are_distinct_across_runs_and_sides():
    seeds = {whole_run.run_seed(0, side, i) for side in whole_run.SIDES for i in range(50)}
    assert len(seeds) == 100
    assert whole_run.run_seed(0, "dclens", 3) == whole_run.run_seed(0, "dclens", 3)
    assert whole_run.run_seed(1, "dclens", 3) != whole_run.run_seed(0, "dclens", 3)


# --------------------------------------------------------------------------- statistics
def test_welch_interval_matches_scipy():
    rng = np.random.default_rng(7)
    a, b = rng.normal(0.5, 0.03, 5), rng.normal(0.52, 0.05, 6)
    difference, low, high, dof = whole_run_study.welch_interval(list(a), list(b))
    result = stats.ttest_ind(b, a, equal_var=False)
    interval = result.confidence_interval(0.95)
    assert difference == pytest.approx(b.mean() - a.mean())
    assert (low, high) == (pytest.approx(interval.low), pytest.approx(interval.high))
    assert dof == pytest.approx(result.df)


def test_welch_interval_with_one_run_a_side_has_no_bounds():
    difference, low, high, _ = whole_run_study.welch_interval([0.5], [0.6, 0.7])
    assert difference == pytest.approx(0.15) and math.isnan(low) and math.isnan(high)


def _fake_study(tmp_path, accuracies: dict[str, list[float]]) -> str:
    """A study directory whose runs' files hold the given val accuracies (everything else
    fixed): for the summary and report only."""
    directory = str(tmp_path / "study")
    config = whole_run.WholeRunConfig.with_budget(15.0, samples=100, **TINY)
    runs = max(len(v) for v in accuracies.values())
    study = whole_run_study.Study(directory, config, str(AUTHORS), runs=runs,
                                  authors=None)
    whole_run_study.open_study(study)
    for side, values in accuracies.items():
        for index, value in enumerate(values):
            folder = study.run_dir(side, index)
            os.makedirs(folder)
            curves = {name: [0.1 * index + j for j in range(3)]
                      for name in whole_run.CURVES}
            # Step seconds: the first holds the set-up; run 1 ran beside other load.
            base = 2.0 if side == "authors" else 0.5
            curves["seconds"] = [30.0, base * (1 + index), base * (1 + index) * 1.1]
            export.write_json(os.path.join(folder, "run.json"), {
                "side": side, "seed": index, "curves": curves, "epsilon": 14.19, "steps": 3,
                "seconds_per_step_after_first": 2.0 if side == "authors" else 0.5,
                "setup_seconds": 1.0, "wall_seconds": 9.0})
            export.write_json(os.path.join(folder, "evaluation.json"), {
                "protocols": {"val": {"accuracy": value}, "sen": {"accuracy": value + 0.1}},
                "quality": {"fid": 100.0 + index, "label_agreement": value / 2}})
    return directory


def test_the_summary_compares_what_the_runs_hold(tmp_path):
    theirs, ours = [0.50, 0.55, 0.52], [0.51, 0.49, 0.56]
    summary = whole_run_study.summarize(_fake_study(
        tmp_path, {"authors": theirs, "dclens": ours}))
    val = summary["comparison"]["val"]
    assert val["authors"]["mean"] == pytest.approx(np.mean(theirs))
    assert val["dclens"]["sd"] == pytest.approx(np.std(ours, ddof=1))
    interval = stats.ttest_ind(ours, theirs, equal_var=False).confidence_interval(0.95)
    assert val["difference"]["low"] == pytest.approx(interval.low)
    assert summary["comparison"]["authors_range1"]["authors"]["n"] == 0   # not run
    assert whole_run_report.agreement(summary) is True
    text = whole_run_report.render(summary, command="cmd", date="2026-11-26")
    assert "the two agree" in text and "4.000x faster" not in text
    # Each side's fastest run by its median step after the first: 0.525 s against 2.1 s.
    assert "dclens takes **0.250x**" in text and "**2.10 s**" in text


def test_a_clear_difference_is_reported_as_one(tmp_path):
    summary = whole_run_study.summarize(_fake_study(
        tmp_path, {"authors": [0.50, 0.51, 0.52], "dclens": [0.70, 0.71, 0.72]}))
    assert whole_run_report.agreement(summary) is False
    assert "they differ" in whole_run_report.render(summary, command="c", date="d")


def test_the_verdict_corrects_for_several_measures_and_waits_for_five_runs(tmp_path):
    """val's 95% interval excludes 0, but not at the Bonferroni level over the three
    measures compared (val, sen, label agreement move together here): no difference is
    claimed.  Five runs a side make the verdict final, fewer a preliminary one."""
    theirs = [0.50, 0.52, 0.51, 0.53, 0.49]
    ours = [0.525, 0.545, 0.535, 0.555, 0.515]
    summary = whole_run_study.summarize(_fake_study(
        tmp_path / "five", {"authors": theirs, "dclens": ours}))
    val = summary["comparison"]["val"]["difference"]
    assert not val["low"] <= 0 <= val["high"]                  # 95%: excludes 0
    adjusted = stats.ttest_ind(ours, theirs, equal_var=False).confidence_interval(
        1 - 0.05 / 3)
    assert whole_run_report.verdict_intervals(summary)["val"] == pytest.approx(
        (adjusted.low, adjusted.high))
    assert adjusted.low <= 0 <= adjusted.high
    assert whole_run_report.agreement(summary) is True
    text = whole_run_report.render(summary, command="c", date="d")
    assert "**Verdict: the two agree**" in text and "98.33%" in text
    three = whole_run_study.summarize(_fake_study(
        tmp_path / "three", {"authors": theirs[:3], "dclens": [0.70, 0.71, 0.72]}))
    text = whole_run_report.render(three, command="c", date="d")
    assert "**Preliminary verdict (3 runs on the smaller side" in text
    assert "they differ" in text


def test_a_study_refuses_to_resume_with_other_settings(tmp_path):
    config = whole_run.WholeRunConfig.with_budget(15.0, samples=100, **TINY)
    study = whole_run_study.Study(str(tmp_path), config, str(AUTHORS), runs=1, authors=None)
    whole_run_study.open_study(study)
    whole_run_study.open_study(dataclasses.replace(study, runs=3))     # more runs: fine
    other = whole_run.WholeRunConfig.with_budget(20.0, samples=100, **TINY)
    with pytest.raises(SideBySideError, match="config differ"):
        whole_run_study.open_study(dataclasses.replace(study, config=other))


def test_a_study_refuses_an_authors_protocol_reading_more_samples_than_a_run_writes():
    config = whole_run.WholeRunConfig.with_budget(15.0, samples=100, **TINY)
    with pytest.raises(SideBySideError, match="reads 10000 samples but each run writes 100"):
        whole_run_study.Study("unused", config, str(AUTHORS))


# --------------------------------------------------------------------------- end to end
@needs_authors
def test_whole_runs_end_to_end_through_the_tool(tmp_path, monkeypatch, capsys):
    from dclens.cli import side_by_side as cli

    monkeypatch.setenv("DCLENS_CACHE", str(tmp_path / "cache"))
    study_dir, results = tmp_path / "study", tmp_path / "results"
    # Two teachers of 100 records: their budget stop samples 100,000 images in batches of
    # B = 100 (their code's fixed count), the test's longest part.
    shared = ["--authors_repo", str(AUTHORS), "--whole_runs", "1", "--teachers", "2",
              "--records", "100", "--batch_size", "100", "--topk", "50", "--sigma", "40",
              "--thresh", "0.5", "--d_step", "2", "--pretrain_teacher", "3", "--z_dim", "10",
              "--samples", "100", "--smoke", "--study_dir", str(study_dir),
              "--results", str(results)]
    argv = [*shared, "--max_eps", "55"]
    assert cli.main(argv) == 0
    runs = {side: json.loads((study_dir / f"{side}-0" / "run.json").read_text())
            for side in whole_run.SIDES}
    for side, run in runs.items():
        folder = study_dir / f"{side}-0"
        assert run["steps"] == 3
        assert all(len(curve) == 3 for curve in run["curves"].values())
        assert all(0 < p <= 1 for p in run["curves"]["pass_fraction"])
        assert all(np.isfinite(run["curves"]["teacher_loss"]))
        with np.load(folder / "samples.npz") as samples:
            assert samples["x"].shape == (100, 28, 28, 1)
            assert samples["y"].shape == (100,)
        assert list(folder.glob("eps-*.data-0.pkl")), f"no authors'-layout pickle in {side}"
        evaluation = json.loads((folder / "evaluation.json").read_text())
        assert 0 <= evaluation["protocols"]["val"]["accuracy"] <= 1
        assert evaluation["quality"]["fid"] >= 0
        assert 0 <= json.loads((folder / "authors_protocol.json").read_text())["accuracy"] <= 1
    # Their RDP counter and our ledger spend the same epsilon at every step.
    assert runs["authors"]["curves"]["epsilon"] == pytest.approx(
        runs["dclens"]["curves"]["epsilon"], rel=1e-9)
    assert runs["authors"]["seed"] != runs["dclens"]["seed"]
    readme = (results / "README.md").read_text()
    assert "1 of 1 runs of the authors' code and 1 of 1 of dclens" in readme
    assert "No verdict yet" in readme            # one run a side: no interval
    assert (results / "curves.png").stat().st_size > 0
    for side in whole_run.SIDES:        # each run's evidence, without its samples
        published = results / "runs" / f"{side}-0"
        assert json.loads((published / "run.json").read_text()) == runs[side]
        assert sorted(p.name for p in published.iterdir()) == [
            "authors_protocol.json", "evaluation.json", "run.json"]
    # Resumed: nothing retrains (the runs' files are untouched), the report is rewritten.
    stamp = (study_dir / "authors-0" / "run.json").stat().st_mtime_ns
    assert cli.main(argv) == 0
    assert (study_dir / "authors-0" / "run.json").stat().st_mtime_ns == stamp
    # Other settings in the same directory are refused, quoting what differs.
    assert cli.main([*shared, "--max_eps", "45"]) == 2
    assert "differ" in capsys.readouterr().err


# --------------------------------------------------------------------------- claims
def test_a_run_claim_is_exclusive_taken_over_when_stale_and_released(tmp_path):
    import socket
    import subprocess
    import sys

    lines = []
    claim = tmp_path / whole_run_study.CLAIM_FILE
    with whole_run_study.claim_run(str(tmp_path), lines.append) as held:
        assert held
        assert claim.read_text() == f"{socket.gethostname()} {os.getpid()}"
        with whole_run_study.claim_run(str(tmp_path), lines.append) as again:
            assert not again                      # a live holder (this very process)
        assert claim.exists() and f"claimed by process {os.getpid()}" in lines[-1]
    assert not claim.exists()                     # released on leaving
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    claim.write_text(f"{socket.gethostname()} {gone}")
    with whole_run_study.claim_run(str(tmp_path), lines.append) as held:
        assert held                               # its process is gone: taken over
    claim.write_text("another-host 1")
    with whole_run_study.claim_run(str(tmp_path), lines.append) as held:
        assert not held and "process 1 on another-host" in lines[-1]
    assert claim.read_text() == "another-host 1"  # respected, not removed


def test_the_authors_protocol_phase_skips_runs_another_process_claimed(tmp_path,
                                                                         monkeypatch):
    import types

    runs = [tmp_path / "authors-0", tmp_path / "dclens-0"]
    for run in runs:
        run.mkdir()
    (runs[0] / whole_run_study.CLAIM_FILE).write_text("another-host 7")
    done = []
    monkeypatch.setattr(whole_run_study, "_trained", lambda study: [
        ("authors", 0, str(runs[0])), ("dclens", 0, str(runs[1]))])
    monkeypatch.setattr(whole_run_study.evaluate, "load_test", lambda *a, **k: "test")
    monkeypatch.setattr(whole_run_study, "load_synthetic", lambda path, name: (path, "npz"))
    folders = {"authors": runs[0], "dclens": runs[1]}
    monkeypatch.setattr(whole_run_study, "samples_of", lambda study, side, index, log: str(
        folders[side] / "samples.npz"))

    def fake_protocol(synthetic, test, protocol, *, seed, state_path, log):
        assert (pathlib.Path(state_path).parent / whole_run_study.CLAIM_FILE).exists()
        done.append(synthetic)
        return {"accuracy": 0.5}
    monkeypatch.setattr(whole_run_study.evaluate, "run_authors_protocol", fake_protocol)
    study = types.SimpleNamespace(
        authors=object(), evaluation=types.SimpleNamespace(test_limit=None,
                                                           seeds=lambda: {"init": 1}))
    whole_run_study.authors_protocol_runs(study, log=lambda _: None)
    assert done == [str(runs[1] / "samples.npz")]          # the claimed run was skipped
    assert json.loads((runs[1] / whole_run_study.AUTHORS_PROTOCOL_FILE).read_text()) == {
        "accuracy": 0.5}
    assert not (runs[1] / whole_run_study.CLAIM_FILE).exists()
    assert not (runs[0] / whole_run_study.AUTHORS_PROTOCOL_FILE).exists()


def test_whole_runs_refuse_a_thread_count_below_one():
    from dclens.cli import side_by_side as cli

    with pytest.raises(SystemExit):
        cli.main(["--authors_repo", str(AUTHORS), "--whole_runs", "1", "--threads", "0",
                  "--max_eps", "5"])


# --------------------------------------------------------------------------- restore
def _restorable_study(tmp_path, **fields) -> whole_run_study.Study:
    """A one-run-a-side study whose authors' protocol reads 50 of the 100 samples."""
    from dclens.evaluation import authors_protocol

    config = whole_run.WholeRunConfig.with_budget(15.0, samples=100, **TINY)
    protocol = authors_protocol.AuthorsProtocol(rows_per_pickle=50, rows=500)
    return whole_run_study.Study(str(tmp_path / "study"), config, str(AUTHORS), runs=1,
                                 authors=protocol, **fields)


def _published_record(study, side: str, index: int = 0) -> dict:
    curves = {name: [0.25 * (step + 1) + index for step in range(3)]
              for name in whole_run.CURVES}
    return {"side": side, "seed": whole_run.run_seed(study.root_seed, side, index),
            "config": json.loads(json.dumps(study.config.to_dict())), "curves": curves,
            "epsilon": 14.19, "steps": 3, "seconds_per_step": 1.0}


def _publish(tmp_path, study, files: dict[str, dict[str, dict]]) -> str:
    """A published study (as copy_run_reports writes it): {run name: {file: content}}."""
    published = tmp_path / "published"
    for name, contents in files.items():
        for file, content in contents.items():
            export.write_json(published / "runs" / name / file, content)
    return str(published)


def _fake_runners(monkeypatch, curves_of, calls: list) -> None:
    """Training replaced by records whose curves ``curves_of(side, seed)`` gives (and an
    empty samples file, as a run writes its samples)."""
    def runner_for(side):
        def run(repo, config, seed, run_dir, log):
            calls.append((side, seed, run_dir))
            pathlib.Path(run_dir, "samples.npz").write_bytes(b"")
            return {"side": side, "seed": seed, "curves": curves_of(side, seed),
                    "config": config.to_dict(), "epsilon": 14.19, "steps": 3,
                    "seconds_per_step": 2.0}
        return run
    monkeypatch.setattr(whole_run_study, "RUNNERS", {s: runner_for(s) for s in whole_run.SIDES})


def test_restore_copies_every_run_and_retrains_a_lost_one_when_a_phase_needs_it(
        tmp_path, monkeypatch):
    study = _restorable_study(tmp_path)
    ours = _published_record(study, "dclens")
    finished = {"run.json": _published_record(study, "authors"),
                "evaluation.json": {"protocols": {"val": {"accuracy": 0.5}}},
                "authors_protocol.json": {"accuracy": 0.6}}
    ours_evaluation = {"protocols": {"val": {"accuracy": 0.4}}}
    published = _publish(tmp_path, study, {
        "authors-0": finished,
        "dclens-0": {"run.json": ours, "evaluation.json": ours_evaluation}})  # no protocol
    whole_run_study.open_study(study)
    lines, calls = [], []
    assert whole_run_study.restore(study, published, lines.append) == {
        "finished": ["authors-0"], "retrain": ["dclens-0"], "kept": []}
    folder = pathlib.Path(study.directory)
    for file, content in finished.items():
        assert json.loads((folder / "authors-0" / file).read_text()) == content
    # The unfinished run's files are there for the summary; nothing trains in phase 1.
    assert json.loads((folder / "dclens-0" / "evaluation.json").read_text()) == ours_evaluation
    _fake_runners(monkeypatch, lambda side, seed: ours["curves"], calls)
    whole_run_study.train(study, lines.append)
    assert calls == []
    assert json.loads((folder / "dclens-0" / "run.json").read_text()) == ours
    # The phase that needs its samples retrains it first, and checks it.
    path = whole_run_study.samples_of(study, "dclens", 0, lines.append)
    assert path == str(folder / "dclens-0" / "samples.npz")
    assert [(side, seed) for side, seed, _ in calls] == [("dclens", ours["seed"])]
    record = json.loads((folder / "dclens-0" / "run.json").read_text())
    assert {key: record["reproduction"][key] for key in ("of", "equal", "first_difference")
            } == {"of": "expected_run.json", "equal": True, "first_difference": None}
    # ... and its published timing (the two sides back to back) stands; the retrain's
    # own (2.0 s, beside whatever else ran) is kept apart.
    assert record["seconds_per_step"] == ours["seconds_per_step"] == 1.0
    assert record["reproduction"]["retrain"]["seconds_per_step"] == 2.0
    assert whole_run_study.keep_published_timing(record, ours) == record    # idempotent
    # Same trajectory, same samples: the published evaluation stands.
    assert json.loads((folder / "dclens-0" / "evaluation.json").read_text()) == ours_evaluation
    assert any("reproduces its published run" in line for line in lines)
    whole_run_study.samples_of(study, "dclens", 0, lines.append)
    assert len(calls) == 1                                  # samples there: no retraining
    with pytest.raises(SideBySideError, match="was not restored from a published study"):
        whole_run_study.samples_of(study, "authors", 0, lines.append)
    # Restoring again keeps what the study now holds.
    assert whole_run_study.restore(study, published, lines.append)["kept"] == [
        "authors-0", "dclens-0"]


def test_a_retrained_run_that_differs_from_its_published_one_is_evaluated_afresh(
        tmp_path, monkeypatch):
    study = _restorable_study(tmp_path)
    ours = _published_record(study, "dclens")
    published = _publish(tmp_path, study, {"dclens-0": {
        "run.json": ours, "evaluation.json": {"protocols": {}}}})
    whole_run_study.open_study(study)
    whole_run_study.restore(study, published, lambda _: None)
    changed = json.loads(json.dumps(ours["curves"]))
    changed["teacher_loss"][2] += 1e-7              # round-off at the third step
    changed["pass_fraction"][1] += 1e-3             # and an earlier one elsewhere
    lines, calls = [], []
    _fake_runners(monkeypatch, lambda side, seed: changed, calls)
    whole_run_study.samples_of(study, "dclens", 0, lines.append)
    run_dir = pathlib.Path(study.run_dir("dclens", 0))
    record = json.loads((run_dir / "run.json").read_text())
    assert record["reproduction"]["equal"] is False
    assert record["reproduction"]["first_difference"] == {
        "curve": "pass_fraction", "step": 2, "published": ours["curves"]["pass_fraction"][1],
        "retrained": changed["pass_fraction"][1]}
    assert not (run_dir / "evaluation.json").exists()          # to be evaluated again
    assert any(line.startswith("WARNING: dclens-0 did NOT reproduce") for line in lines)


def test_restore_refuses_runs_of_another_seed_or_a_folder_without_runs(tmp_path):
    study = _restorable_study(tmp_path)
    whole_run_study.open_study(study)
    with pytest.raises(SideBySideError, match="holds no published runs"):
        whole_run_study.restore(study, str(tmp_path / "nothing"), lambda _: None)
    record = dict(_published_record(study, "authors"), seed=12345)
    published = _publish(tmp_path, study, {"authors-0": {"run.json": record}})
    with pytest.raises(SideBySideError, match="another seed than run authors-0.*12345"):
        whole_run_study.restore(study, published, lambda _: None)
    assert not os.path.exists(study.run_dir("authors", 0))    # nothing copied
    other = dict(_published_record(study, "authors"), config={"steps": 4})
    published = _publish(tmp_path / "2", study, {"authors-0": {"run.json": other}})
    with pytest.raises(SideBySideError, match="another configuration"):
        whole_run_study.restore(study, published, lambda _: None)


def test_only_the_chosen_runs_are_trained_and_claimed_runs_are_skipped(tmp_path,
                                                                       monkeypatch):
    study = dataclasses.replace(_restorable_study(tmp_path), runs=2)
    whole_run_study.open_study(study)
    calls = []
    _fake_runners(monkeypatch, lambda side, seed: {}, calls)
    claimed = pathlib.Path(study.run_dir("authors", 1))
    claimed.mkdir(parents=True)
    (claimed / whole_run_study.TRAIN_CLAIM_FILE).write_text("another-host 7")
    lines = []
    whole_run_study.train(dataclasses.replace(study, only=("dclens-0", "authors-1")),
                          lines.append)
    assert [pathlib.Path(run_dir).name for _, _, run_dir in calls] == ["dclens-0"]
    assert "claimed by process 7 on another-host" in " ".join(lines)
    assert not (claimed / "run.json").exists()
    assert not (pathlib.Path(study.run_dir("dclens", 0)) /
                whole_run_study.TRAIN_CLAIM_FILE).exists()       # released


@pytest.mark.parametrize("only", [("dclens-2",), ("teacher-0",), ()])
def test_runs_to_work_on_must_be_runs_of_the_study(tmp_path, only):
    with pytest.raises(SideBySideError, match="must be named <side>-<i>"):
        _restorable_study(tmp_path, only=only)
