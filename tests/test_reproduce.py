"""scripts/reproduce.py and scripts/evaluate.py end to end on tiny data; config scaling."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dclens.privacy import accounting
from dclens.common import provenance as provenance_lib
from dclens.experiments import reproduce
from dclens.experiments import paper_rows
from dclens.datalens import config as cfg
from conftest import load_script

reproduce_cli = load_script("reproduce")
evaluate_cli = load_script("evaluate")

TINY_EVAL = ["--epochs", "2", "--batch_size", "16", "--quality_samples", "40",
             "--val_fraction", "0.2"]


@pytest.fixture(scope="module")
def tiny_report(tiny_fmnist_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("reproduce")
    argv = ["fashion_mnist", "--eps", "1", "--teachers", "4", "--max_records", "80",
            "--num_samples", "60", "--train_epochs", "1", "--seed", "3",
            "--teacher_chunk", "4", "--data_dir", str(tiny_fmnist_dir),
            "--out", str(root / "report"), "--run_dir", str(root / "run"),
            "--cache_dir", str(root / "cache"), "--quiet", *TINY_EVAL]
    assert reproduce_cli.main(argv) == 0
    return root, argv


def test_reproduce_writes_a_report_that_says_it_is_scaled(tiny_report):
    root, _ = tiny_report
    out = root / "report"
    for name in ("report.md", "report.json", "evaluation.png", "epsilon.png", "samples.png"):
        assert (out / name).stat().st_size > 0, name
    report = json.loads((out / "report.json").read_text())
    assert report["paper_config"] is False
    assert any("4 teachers instead of the paper's 4000" in d for d in report["deviations"])
    assert report["accuracy"]["paper"] == 0.6478
    assert 0.0 <= report["accuracy"]["val"] <= 1.0 and 0.0 <= report["accuracy"]["sen"] <= 1.0
    assert report["privacy"]["steps"] == 1 and report["privacy"]["stop_reason"] == "epochs"
    assert report["privacy"]["epsilon"]["epsilon"] <= 1.0
    assert report["batch"] == 15                       # the paper run's effective batch
    assert report["provenance"]["command"].startswith("python scripts/reproduce.py "
                                                      "fashion_mnist --eps 1")
    assert report["provenance"]["machine"]["cpu_count"] >= 1
    assert report["provenance"]["machine"]["cpu"]           # the CPU that ran it, by name
    assert report["generator_init"] == reproduce.GENERATOR_INIT
    assert report["real_reference"]["samples"] == 120
    assert report["quality"]["fid"] >= 0
    markdown = (out / "report.md").read_text()
    assert "NOT the paper config" in markdown
    assert "0.6478" in markdown and "domain-classifier" in markdown
    assert "fixed --seed" in markdown
    # Small files only next to the report; the big run outputs are in the run dir.
    assert not list(out.glob("*.npz")) and not list(out.glob("*.pkl"))
    assert (root / "run" / "samples.npz").exists()


def test_skip_train_evaluates_again_and_refuses_an_existing_run(tiny_report, capsys):
    root, argv = tiny_report
    assert reproduce_cli.main(argv) == 2
    assert "already holds a finished run" in capsys.readouterr().err
    out2 = root / "report2"
    argv2 = [a if a != str(root / "report") else str(out2) for a in argv]
    assert reproduce_cli.main(argv2 + ["--skip_train", "--no_reference", "--no_quality"]) == 0
    report = json.loads((out2 / "report.json").read_text())
    assert report["seconds"]["train"] is None
    assert report["real_reference"] is None and report["quality"] is None
    # A new report of an old run cannot know how that run initialised its generator.
    assert report["generator_init"].startswith("unknown")


def test_a_run_whose_outputs_were_cut_short_is_completed_not_refused(tiny_report, tmp_path,
                                                                       capsys):
    # A full disk while the final outputs are written leaves samples.npz but not the
    # pickles after it or samples.png: the same command must write them again from the
    # final checkpoint (no step and no privacy spent again), not call the run finished.
    import shutil

    root, argv = tiny_report
    run_dir = tmp_path / "run"
    shutil.copytree(root / "run", run_dir)
    ledger_before = (run_dir / "ledger.json").read_text()
    samples_before = (run_dir / "samples.npz").read_bytes()
    pickles = sorted(run_dir.glob("eps-*.data-*.pkl"))
    for cut in [run_dir / "samples.png", *pickles[len(pickles) // 2:]]:
        cut.unlink()
    argv2 = [str(run_dir) if a == str(root / "run") else
             str(tmp_path / "report") if a == str(root / "report") else a for a in argv]
    assert reproduce_cli.main(argv2) == 0
    assert "already holds a finished run" not in capsys.readouterr().err
    assert (run_dir / "samples.png").stat().st_size > 0
    assert sorted(run_dir.glob("eps-*.data-*.pkl")) == pickles
    assert (run_dir / "ledger.json").read_text() == ledger_before      # nothing spent again
    assert (run_dir / "samples.npz").read_bytes() == samples_before    # the same samples
    assert (tmp_path / "report" / "report.json").exists()


def test_evaluate_cli_on_the_run_directory(tiny_report, tiny_fmnist_dir, tmp_path):
    root, _ = tiny_report
    prefix = str(next((root / "run").glob("eps-*.data-0.pkl")))[:-len("-0.pkl")]
    code = evaluate_cli.main([prefix, "--out", str(tmp_path),
                              "--no_quality", *TINY_EVAL])
    assert code == 0
    record = json.loads((tmp_path / "evaluation.json").read_text())
    assert record["input"]["kind"] == "authors_pickles" and record["input"]["samples"] == 60
    assert record["test"]["samples"] == 40           # the tiny test split of the run's data
    assert set(record["protocols"]) == {"val", "sen"}
    assert (tmp_path / "evaluation.png").exists()


def test_checkpoint_every_reaches_train_run_and_zero_is_refused(tiny_fmnist_dir, tmp_path,
                                                                monkeypatch, capsys,
                                                                ctrl_c_is_python_s):
    """Also: provenance (commit, dirty tree) is taken before training starts, since the
    tree may move on during a run of hours; Ctrl-C pauses the training at a step boundary
    (the tool's handler, only while it trains: it is Python's own again after)."""
    import signal

    from dclens.cli.graceful_stop import GracefulStop
    from dclens.datalens import run

    seen, events = {}, []

    class Stop(Exception):
        pass

    def fake_train_run(config, run_dir, **kwargs):
        events.append("train")
        seen.update(kwargs, run_dir=run_dir, handler=signal.getsignal(signal.SIGINT))
        raise Stop

    monkeypatch.setattr(run, "train_run", fake_train_run)
    monkeypatch.setattr(reproduce, "provenance", lambda command: events.append("provenance"))
    argv = ["fashion_mnist", "--eps", "1", "--teachers", "4", "--max_records", "80",
            "--data_dir", str(tiny_fmnist_dir), "--run_dir", str(tmp_path / "run"),
            "--out", str(tmp_path / "out"), "--quiet"]
    with pytest.raises(Stop):
        reproduce_cli.main(argv + ["--checkpoint_every", "25"])
    assert seen["checkpoint_every"] == 25 and seen["run_dir"] == str(tmp_path / "run")
    assert events == ["provenance", "train"]
    assert isinstance(seen["should_stop"], GracefulStop)
    assert seen["handler"] == seen["should_stop"]._handle
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(SystemExit) as exit_info:
        reproduce_cli.main(argv + ["--checkpoint_every", "0"])
    assert exit_info.value.code == 2
    assert "--checkpoint_every must be >= 1 (generator steps between checkpoints), got 0" in (
        capsys.readouterr().err)
    assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()


def test_provenance_ignores_untracked_outputs(monkeypatch):
    calls = []

    def fake_git(*args):
        calls.append(args)
        return "" if args[0] == "status" else "abc123"

    monkeypatch.setattr(provenance_lib, "git", fake_git)
    record = reproduce.provenance("python scripts/reproduce.py fashion_mnist --eps 1")
    assert ("status", "--porcelain", "--untracked-files=no") in calls
    assert record["commit"] == "abc123" and record["uncommitted_changes"] is False


def test_evaluate_cli_errors(tmp_path, capsys):
    assert evaluate_cli.main([str(tmp_path / "nope.npz")]) == 2
    assert "nope.npz not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evaluate_cli.main([])


def test_build_config_paper_and_scaled():
    config, deviations = paper_rows.build_config(paper_rows.ReproduceOptions("fashion_mnist", 10))
    assert deviations == [] and config == cfg.paper_preset("fashion_mnist", 10)
    scaled, deviations = paper_rows.build_config(
        paper_rows.ReproduceOptions("fashion_mnist", 1, scale=0.05))
    assert scaled.train.num_teachers == 200 and scaled.train.batch_size == 15
    assert scaled.topagg == cfg.paper_preset("fashion_mnist", 1).topagg
    assert deviations and paper_rows.ReproduceOptions(
        "fashion_mnist", 1, scale=0.05).default_name() == "fashion_mnist-eps1-t200"
    assert paper_rows.ReproduceOptions("fashion_mnist", 10).default_name() == "fashion_mnist-eps10"
    assert paper_rows.ReproduceOptions(
        "fashion_mnist", 10, epochs=50, num_samples=1000, max_records=600,
        non_private=True).default_name() == "fashion_mnist-eps10-e50-n1000-r600-nonprivate"
    free, deviations = paper_rows.build_config(
        paper_rows.ReproduceOptions("fashion_mnist", 1, teachers=200, non_private=True))
    assert free.train.non_private and free.topagg.sigma == 0.0
    steps = accounting.max_steps_within(sigma=5000.0, topk=200, queries_per_step=15,
                                        max_eps=1.0, delta=1e-5, conversion="classic")
    steps_per_epoch = (60_000 // 200) // 15
    assert (free.train.epochs - 1) * steps_per_epoch < steps <= free.train.epochs * steps_per_epoch
    assert any("NON-PRIVATE" in d for d in deviations)
    with pytest.raises(paper_rows.ReproduceError, match="celebA-hair"):
        paper_rows.ReproduceOptions("celebA-hair", 1)
    with pytest.raises(paper_rows.ReproduceError, match="scale must be in"):
        paper_rows.ReproduceOptions("fashion_mnist", 1, scale=2.0)


def test_rerender_rewrites_the_markdown_from_the_json(tiny_report):
    root, _ = tiny_report
    out = root / "report"
    (out / "report.md").write_text("stale")
    assert reproduce_cli.main(["fashion_mnist", "--eps", "1", "--rerender", "--out",
                               str(out), "--quiet"]) == 0
    markdown = (out / "report.md").read_text()
    assert "NOT the paper config" in markdown and "## Scale" in markdown


def test_official_flag_gives_the_authors_schedule_and_flags_override_it():
    parser = evaluate_cli.build_parser()
    settings = evaluate_cli.settings_from_args(
        parser.parse_args(["x.npz", "--official", "--epochs", "5"]), "fashion_mnist")
    assert (settings.schedule.optimizer, settings.schedule.learning_rate,
            settings.schedule.batch_size, settings.schedule.epochs) == ("sgd", 2e-3, 512, 5)
    assert settings.official and settings.sen_on_all_data
    default = evaluate_cli.settings_from_args(parser.parse_args(["x.npz"]), "fashion_mnist")
    assert default.schedule.optimizer == "adam" and not default.sen_on_all_data


def test_analysis_rows_change_only_what_they_name_and_say_so():
    options = paper_rows.ReproduceOptions(dataset="fashion_mnist", eps=1, teachers=400,
                                         aggregation="klevel", thresh=0.5, topk=100)
    assert options.default_name() == "fashion_mnist-eps1-t400-klevel-b0.5-k100"
    config, deviations = paper_rows.build_config(options)
    assert config.topagg.method.value == "klevel"
    assert (config.topagg.thresh, config.topagg.topk) == (0.5, 100)
    assert config.topagg.sigma == 5000.0                    # the paper's otherwise
    assert any("aggregation klevel" in d for d in deviations)
    same = paper_rows.ReproduceOptions(dataset="fashion_mnist", eps=1, thresh=0.9, topk=200,
                                      aggregation="topk_stochastic_sign")
    assert same.default_name() == "fashion_mnist-eps1"       # the paper's values: no change
    with pytest.raises(paper_rows.ReproduceError, match="unknown aggregation 'nope'"):
        paper_rows.ReproduceOptions(aggregation="nope")


def test_levers_beyond_the_paper_are_named_deviations():
    """--conversion pld and --generator_ema: in the run's name, its config and its
    deviations; at the paper's eps = 1 the exact accounting runs 149 steps, not 86."""
    options = paper_rows.ReproduceOptions("fashion_mnist", 1, conversion="pld",
                                         generator_ema=0.9)
    assert options.default_name() == "fashion_mnist-eps1-pld-ema0.9"
    config, deviations = paper_rows.build_config(options)
    assert config.budget.conversion is accounting.Conversion.PLD
    assert config.train.generator_ema == 0.9
    assert config.budget.max_eps == 1.0 and config.topagg.sigma == 5000.0
    assert [d.split(":")[0] for d in deviations] == ["beyond the paper"] * 2
    assert accounting.max_steps_within(sigma=5000.0, topk=200, queries_per_step=15,
                                       max_eps=1.0, delta=1e-5, conversion="pld") == 149
    same = paper_rows.ReproduceOptions("fashion_mnist", 1, conversion="classic",
                                      generator_ema=0.0)
    assert same.default_name() == "fashion_mnist-eps1"
    assert paper_rows.build_config(same) == (cfg.paper_preset("fashion_mnist", 1), [])
    with pytest.raises(paper_rows.ReproduceError, match="unknown conversion 'exactish'"):
        paper_rows.ReproduceOptions(conversion="exactish")
    for bad in (1.0, -0.5, True, "0.9"):
        with pytest.raises(paper_rows.ReproduceError, match="generator_ema must be a decay"):
            paper_rows.ReproduceOptions(generator_ema=bad)
    rate = paper_rows.ReproduceOptions("fashion_mnist", 1, learning_rate=5e-4)
    assert rate.default_name() == "fashion_mnist-eps1-lr0.0005"
    config, deviations = paper_rows.build_config(rate)
    assert config.train.learning_rate == 5e-4 and "learning rate 0.0005" in deviations[0]
    assert config.budget == cfg.paper_preset("fashion_mnist", 1).budget   # same accounting
    assert paper_rows.ReproduceOptions("fashion_mnist", 1,
                                       learning_rate=1e-3).default_name() == "fashion_mnist-eps1"
    for bad in (0.0, -1e-3, float("nan"), True):
        with pytest.raises(paper_rows.ReproduceError, match="learning_rate must be"):
            paper_rows.ReproduceOptions(learning_rate=bad)


def test_equal_epsilon_tradeoff_levers_keep_the_budget_and_change_the_steps():
    """--sigma_factor and --train_batch_size (issue 39's lever 3): the budget stays the
    one the run had without them, the ledger's sigma / queries per step are the ones used,
    so the steps at that budget move as RDP says (~F^2 times, ~paper batch / B times)."""
    def steps(config):
        return accounting.max_steps_within(
            sigma=config.topagg.sigma, topk=config.topagg.topk,
            queries_per_step=config.train.batch_size * config.train.g_step,
            max_eps=config.budget.max_eps, delta=config.budget.delta,
            conversion=config.budget.conversion)

    screen = dict(teachers=200, max_records=3000, sigma_scale=0.05)
    base, _ = paper_rows.build_config(paper_rows.ReproduceOptions(**screen))
    assert steps(base) == 86
    noisier = paper_rows.ReproduceOptions(**screen, sigma_factor=2.0)
    assert noisier.default_name() == "fashion_mnist-eps1-t200-r3000-sigma0.05-sf2"
    config, deviations = paper_rows.build_config(noisier)
    assert config.topagg.sigma == 2 * base.topagg.sigma == 500.0
    assert config.budget == base.budget and config.train == base.train
    assert "sigma = 500 (2 x 250) under the same epsilon budget" in deviations[-1]
    assert 4 * 86 - 4 <= steps(config) <= 4 * 87          # RDP: steps ~ sigma^2
    cleaner, _ = paper_rows.build_config(paper_rows.ReproduceOptions(**screen,
                                                                     sigma_factor=0.7))
    assert cleaner.topagg.sigma == 175.0 and steps(cleaner) < 86 * 0.7 ** 2 + 1
    small = paper_rows.ReproduceOptions(**screen, batch_size=5)
    assert small.default_name() == "fashion_mnist-eps1-t200-r3000-sigma0.05-bs5"
    config, deviations = paper_rows.build_config(small)
    assert config.train.batch_size == 5 and config.topagg == base.topagg
    assert config.budget == base.budget and "batch 5 instead of 15" in deviations[-1]
    assert 3 * 86 - 3 <= steps(config) <= 3 * 87
    # At the paper's scale the paper's sigma and batch are the base; the paper's values
    # are no change at all.
    full, _ = paper_rows.build_config(paper_rows.ReproduceOptions(sigma_factor=1.5))
    assert full.topagg.sigma == 7500.0 and full.budget.max_eps == 1.0
    same = paper_rows.ReproduceOptions(sigma_factor=1.0, batch_size=15)
    assert same.default_name() == "fashion_mnist-eps1"
    assert paper_rows.build_config(same) == (cfg.paper_preset("fashion_mnist", 1), [])
    for bad in (0.0, -1.0, float("inf"), True, "2"):
        with pytest.raises(paper_rows.ReproduceError, match="sigma_factor must be"):
            paper_rows.ReproduceOptions(sigma_factor=bad)
    with pytest.raises(paper_rows.ReproduceError, match="non_private run has none"):
        paper_rows.ReproduceOptions(sigma_factor=2.0, non_private=True)
    with pytest.raises(paper_rows.ReproduceError, match="batch_size must be an integer"):
        paper_rows.ReproduceOptions(batch_size=0)
    with pytest.raises(paper_rows.ReproduceError,
                       match="batch_size 16 exceeds the partition size 15"):
        paper_rows.ReproduceOptions(**screen, batch_size=16)
    parsed = reproduce_cli.build_parser().parse_args(
        ["fashion_mnist", "--eps", "1", "--sigma_factor", "1.5", "--train_batch_size", "5"])
    assert (parsed.sigma_factor, parsed.train_batch_size) == (1.5, 5)
    assert parsed.batch_size is None          # the classifier's batch is another flag


def test_scale_deviation_names_the_partition_size_and_whether_it_is_the_papers():
    _, kept = paper_rows.build_config(paper_rows.ReproduceOptions(teachers=200,
                                                                  max_records=3000))
    assert "200 teachers instead of the paper's 4000 (partitions of 15 records, as the " \
           "paper's)" in kept[0]
    _, grown = paper_rows.build_config(paper_rows.ReproduceOptions(teachers=400))
    assert "400 teachers instead of the paper's 4000 (partitions of 150 records instead " \
           "of 15)" in grown[0]


def test_teacher_steps_lever_sets_only_the_teachers_steps_and_keeps_the_accounting():
    """--teacher_steps (the authors' d_step) is a named deviation that changes the teachers'
    Adam steps per generator step and nothing the ledger reads: the same budget, sigma and
    queries per step, so the same number of steps; the paper's value is no change."""
    paper = cfg.paper_preset("fashion_mnist", 1)
    options = paper_rows.ReproduceOptions("fashion_mnist", 1, teacher_steps=4)
    assert options.default_name() == "fashion_mnist-eps1-ds4"
    config, deviations = paper_rows.build_config(options)
    assert config.train.d_step == 4 and paper.train.d_step == 2
    assert config.train.pretrain_teacher == paper.train.pretrain_teacher
    assert dataclasses.replace(config.train, d_step=2) == paper.train
    assert (config.topagg, config.budget) == (paper.topagg, paper.budget)
    assert deviations == ["beyond the paper: 4 Adam steps per teacher per generator step "
                          "instead of 2 (each on its own partition; the same sensitivity)"]
    same = paper_rows.ReproduceOptions("fashion_mnist", 1, teacher_steps=2)
    assert same.default_name() == "fashion_mnist-eps1"
    assert paper_rows.build_config(same) == (paper, [])
    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(paper_rows.ReproduceError,
                           match=f"teacher_steps must be an integer >= 1, got {bad!r}"):
            paper_rows.ReproduceOptions(teacher_steps=bad)
    parsed = reproduce_cli.build_parser().parse_args(
        ["fashion_mnist", "--eps", "1", "--teacher_steps", "3"])
    assert parsed.teacher_steps == 3


def test_add_authors_adds_the_protocol_to_an_existing_report(tiny_report, tmp_path, capsys):
    """--add_authors runs only the authors' protocol on the reported run's samples, keeps
    val/sen, resumes from its state file, and refuses what cannot be read."""
    import shutil

    from dclens.evaluation import authors_protocol

    root, _ = tiny_report
    out, run = tmp_path / "report", tmp_path / "run"
    shutil.copytree(root / "report", out)
    run.mkdir()
    shutil.copyfile(root / "run" / "samples.npz", run / "samples.npz")
    before = json.loads((out / "report.json").read_text())
    small = authors_protocol.AuthorsProtocol(range=2, rows_per_pickle=25, rows=120,
                                             batch_size=16, epochs=2)
    report = reproduce.add_authors_protocol(str(out), small, run_dir=str(run),
                                            log=lambda line: None)
    entry = report["evaluation"]["protocols"]["authors_range2"]
    assert entry["finished"] and entry["curve"]["epoch"] == [1, 2]
    assert report["accuracy"]["authors"] == {"2": entry["accuracy"]}
    assert entry["accuracy"] == max(entry["curve"]["test_accuracy"])
    for kept in ("val", "sen"):
        assert report["accuracy"][kept] == before["accuracy"][kept]
    assert (run / "authors-range2.npz").exists()
    assert json.loads((out / "report.json").read_text()) == report
    markdown = (out / "report.md").read_text()
    assert "| `authors`, range 2 (their script: SGD lr 0.002, 2 epochs on the first 50" in markdown
    # The CLI: the real protocol reads 10,000 samples per pickle; 60 are not enough.
    code = reproduce_cli.main(["fashion_mnist", "--eps", "1", "--out", str(out),
                               "--run_dir", str(run), "--add_authors", "1", "--quiet"])
    assert code == 2 and "reads 10000 samples but only 60" in capsys.readouterr().err
    with pytest.raises(paper_rows.ReproduceError, match="samples.npz not found"):
        reproduce.add_authors_protocol(str(out), small, run_dir=str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit):
        reproduce_cli.main(["fashion_mnist", "--eps", "1", "--add_authors", "1",
                            "--protocol", "authors"])
    assert "drop --protocol authors" in capsys.readouterr().err


def test_add_quality_remeasures_as_the_evaluation_did(tiny_report, tmp_path, capsys):
    """--add_quality repeats the evaluation's quality measure exactly (same subset seed,
    samples and domain classifier): a report stripped of label agreement and the per-class
    scores gets back the values its evaluation wrote, and its FID is unchanged; accuracies
    are kept."""
    import shutil

    root, _ = tiny_report
    out = tmp_path / "report"
    shutil.copytree(root / "report", out)
    original = json.loads((out / "report.json").read_text())
    stripped = json.loads(json.dumps(original))
    for record in (stripped["quality"], stripped["evaluation"]["quality"]):
        del record["label_agreement"], record["per_class"]
    (out / "report.json").write_text(json.dumps(stripped))
    assert reproduce_cli.main(["fashion_mnist", "--eps", "1", "--out", str(out),
                               "--run_dir", str(root / "run"), "--cache_dir",
                               str(root / "cache"), "--add_quality", "--quiet"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["quality"]["label_agreement"] == original["quality"]["label_agreement"]
    assert report["quality"]["fid"] == original["quality"]["fid"]
    assert report["quality"]["per_class"] == original["quality"]["per_class"]
    assert report["evaluation"]["quality"] == report["quality"]
    assert report["accuracy"] == original["accuracy"]
    assert report["quality"]["provenance"]["command"].endswith("--add_quality --quiet")
    markdown = (out / "report.md").read_text()
    assert "Label agreement (" in markdown and "Measured after the evaluation" in markdown
    assert "intra-class FID **" in markdown
    code = reproduce_cli.main(["fashion_mnist", "--eps", "1", "--out", str(out),
                               "--run_dir", str(tmp_path / "nowhere"), "--add_quality",
                               "--quiet"])
    assert code == 2 and "samples.npz not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        reproduce_cli.main(["fashion_mnist", "--eps", "1", "--add_quality", "--rerender"])
    assert "--add_quality and --rerender are separate actions" in capsys.readouterr().err


def test_fidelity_options_are_the_authors_choices_named_but_not_deviations():
    """--balanced_partition / --fake_rendering teacher_labels set the authors' partition
    and rendering; the run stays at the paper config (they are the authors' choices), but
    its name says so, so it never shares a folder or a Table 1 row with a default run."""
    options = paper_rows.ReproduceOptions("fashion_mnist", 1, balanced_partition=True,
                                         fake_rendering="teacher_labels")
    assert options.default_name() == "fashion_mnist-eps1-balanced-teacher_labels"
    config, deviations = paper_rows.build_config(options)
    assert deviations == []
    assert config.train.balanced_partition
    assert config.train.fake_rendering is cfg.FakeRendering.TEACHER_LABELS
    assert not config.accounting_proven
    assert config.replace(train={"balanced_partition": False,
                                 "fake_rendering": cfg.FakeRendering.CLASS_GRID}) \
        == cfg.paper_preset("fashion_mnist", 1)
    same = paper_rows.ReproduceOptions("fashion_mnist", 1, fake_rendering="class_grid")
    assert same.default_name() == "fashion_mnist-eps1"
    with pytest.raises(paper_rows.ReproduceError, match="unknown fake_rendering 'nope'"):
        paper_rows.ReproduceOptions(fake_rendering="nope")
    with pytest.raises(paper_rows.ReproduceError, match="balanced_partition must be"):
        paper_rows.ReproduceOptions(balanced_partition="yes")
    args = reproduce_cli.build_parser().parse_args(
        ["fashion_mnist", "--eps", "1", "--balanced_partition", "--fake_rendering",
         "teacher_labels"])
    assert (args.balanced_partition, args.fake_rendering) == (True, "teacher_labels")


def _steps_within_budget(sigma: float, sensitivity: float, queries: int,
                         config: cfg.DataLensConfig) -> int:
    """Steps a run takes before its budget, spending step by step as training does."""
    ledger = accounting.PrivacyLedger(
        delta=config.budget.delta, conversion=config.budget.conversion,
        orders=accounting.classic_orders(config.budget.max_order))
    event = accounting.gaussian_queries_event(noise_multiplier=sigma / sensitivity,
                                              queries=queries)
    steps = 0
    while ledger.epsilon_after_event(event).epsilon <= config.budget.max_eps:
        ledger.spend(event)
        steps += 1
    return steps


def test_sigma_scale_keeps_the_paper_steps_at_a_truthfully_raised_budget():
    paper = cfg.paper_preset("fashion_mnist", 1)
    paper_steps = accounting.max_steps_within(sigma=5000.0, topk=200, queries_per_step=15,
                                              max_eps=1.0, delta=1e-5, conversion="classic")
    assert paper_rows.paper_steps("fashion_mnist", 1) == paper_steps
    options = paper_rows.ReproduceOptions("fashion_mnist", 1, teachers=200,
                                         max_records=3000, sigma_scale=0.05)
    assert options.default_name() == "fashion_mnist-eps1-t200-r3000-sigma0.05"
    config, deviations = paper_rows.build_config(options)
    assert config.topagg.sigma == pytest.approx(250.0)
    assert config.budget.max_eps == paper_rows.matched_budget("fashion_mnist", 1, 250.0)
    assert config.budget.max_eps > 10                 # far from the paper's epsilon = 1 ...
    assert any(d.startswith("NOT epsilon = 1") for d in deviations)   # ... and says so
    assert any("relative to the vote sum (at most 200) is 1x the paper's" in d
               for d in deviations)
    # Spent step by step as training spends, TopAgg stops after exactly the paper's steps.
    topagg = 2 * 200 ** 0.5
    assert _steps_within_budget(250.0, topagg, 15, config) == paper_steps
    # Another mechanism (all D = 784 coordinates vote) runs the steps its own sensitivity
    # allows at the paper scale, up to the rounding of one step.
    dense = 2 * 784 ** 0.5
    at_paper = _steps_within_budget(5000.0, dense, 15, paper)
    assert abs(_steps_within_budget(250.0, dense, 15, config) - at_paper) <= 1
    assert at_paper < paper_steps / 2
    # Without it the reduced scale keeps the paper's sigma and budget.
    plain = paper_rows.build_config(paper_rows.ReproduceOptions("fashion_mnist", 1,
                                                              teachers=200))[0]
    assert (plain.topagg.sigma, plain.budget.max_eps) == (5000.0, 1.0)
    for bad in (0, 1.5, True, "0.1"):
        with pytest.raises(paper_rows.ReproduceError, match="sigma_scale must be in"):
            paper_rows.ReproduceOptions("fashion_mnist", 1, sigma_scale=bad)
    with pytest.raises(paper_rows.ReproduceError, match="non_private run has none"):
        paper_rows.ReproduceOptions("fashion_mnist", 1, sigma_scale=0.5, non_private=True)
