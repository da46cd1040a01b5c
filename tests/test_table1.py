"""Table 1 across runs (dclens/experiments/table1.py, scripts/table1.py): which reports count, the
mean and sample standard deviation per protocol, the markdown section kept in place."""

from __future__ import annotations

import json
import math

import pytest

from dclens.experiments import table1
from conftest import load_script


def _cli():
    return load_script("table1")


def _report(name, eps, val, sen, *, authors=None, paper_config=True):
    """A report.json as reproduce.py writes it, reduced to what table1 reads."""
    protocols = {"val": {"accuracy": val, "epoch": 3}, "sen": {"accuracy": sen, "epoch": 1}}
    for rng, (accuracy, done, total) in (authors or {}).items():
        curve = [accuracy * (e + 1) / done for e in range(done)]
        protocols[f"authors_range{rng}"] = {
            "accuracy": max(curve), "epoch": done, "finished": done == total,
            "settings": {"range": rng, "epochs": total},
            "curve": {"epoch": list(range(1, done + 1)), "test_accuracy": curve}}
    return {"name": name, "dataset": "fashion_mnist", "eps": eps,
            "paper_config": paper_config, "generator_init": "independent seed per layer",
            "accuracy": {"paper": 0.6478 if eps == 1 else 0.7061},
            "privacy": {"epsilon": {"epsilon": 0.99}, "steps": 86},
            "provenance": {"commit": "abcdef0123", "machine": {"cpu": "Test CPU"}},
            "evaluation": {"protocols": protocols,
                           "curves": {"epoch": [1, 2, 3], "test_accuracy": [sen, 0.2, val]}}}


@pytest.fixture
def results(tmp_path):
    reports = [
        _report("fmnist-eps1", 1, 0.3, 0.45, authors={1: (0.6, 4, 4)}),
        _report("fmnist-eps1-run2", 1, 0.4, 0.55, authors={1: (0.5, 4, 4),
                                                           10: (0.7, 2, 4)}),
        _report("fmnist-eps1-run3", 1, 0.5, 0.65),
        _report("fmnist-eps10", 10, 0.37, 0.59),
        _report("fmnist-eps1-t50", 1, 0.9, 0.9, paper_config=False),   # scaled: excluded
    ]
    for report in reports:
        folder = tmp_path / report["name"]
        folder.mkdir()
        (folder / "report.json").write_text(json.dumps(report))
    return tmp_path


def test_mean_and_sample_sd_per_protocol_over_the_paper_config_runs(results):
    runs = table1.collect(str(results))
    assert [r.name for r in runs] == ["fmnist-eps1", "fmnist-eps1-run2", "fmnist-eps1-run3",
                                      "fmnist-eps10"]
    eps1, eps10 = table1.summarise(runs)
    assert eps1["runs"] == ["fmnist-eps1", "fmnist-eps1-run2", "fmnist-eps1-run3"]
    val = eps1["protocols"]["val"]
    assert val["n"] == 3 and val["mean"] == pytest.approx(0.4, abs=1e-12)
    assert val["sd"] == pytest.approx(0.1, abs=1e-12)            # ddof = 1, by hand
    authors = eps1["protocols"]["authors_range1"]
    assert authors["n"] == 2 and authors["mean"] == pytest.approx(0.55)
    assert authors["sd"] == pytest.approx(math.sqrt(2 * 0.05 ** 2), abs=1e-12)
    assert eps1["protocols"]["authors_range10"]["n"] == 0        # unfinished does not count
    assert eps10["protocols"]["val"] == {"n": 1, "mean": 0.37, "sd": None}


def test_runs_on_the_index_partition_form_their_own_row(results):
    """A run on the (proven) index partition is not averaged with the class-balanced
    runs, whose epsilon is not a proven guarantee; each row and run says which it is."""
    report = _report("fmnist-eps1-index", 1, 0.5, 0.6)
    report["config"] = {"train": {"balanced_partition": False}}
    (results / "fmnist-eps1-index").mkdir()
    (results / "fmnist-eps1-index" / "report.json").write_text(json.dumps(report))
    rows = table1.summarise(table1.collect(str(results)))
    by_partition = {(r["eps"], r["partition"]): r for r in rows}
    assert by_partition[(1, "index")]["runs"] == ["fmnist-eps1-index"]
    assert len(by_partition[(1, "class-balanced")]["runs"]) == 3
    text = table1.render(table1.collect(str(results)))
    assert "eps = 1, index partition |" in text
    assert "class-balanced partition (the authors'; epsilon NOT a proven guarantee)" in text


def test_fidelity_options_form_their_own_row_and_quality_is_averaged(results):
    """A run with the authors' fake-batch rendering is a row of its own (a fidelity option
    is measured beside, never averaged into, the default); FID and label agreement are
    summarised per row over the runs that measured them, by hand below."""
    for name, fid, agreement, rendering in (("fmnist-eps1-tl", 70.0, 0.5, "teacher_labels"),
                                            ("fmnist-eps1-tl2", 80.0, None, "teacher_labels")):
        report = _report(name, 1, 0.5, 0.6)
        report["config"] = {"train": {"balanced_partition": False,
                                      "fake_rendering": rendering}}
        report["quality"] = {"fid": fid, "label_agreement": agreement}
        if agreement is not None:
            report["quality"]["per_class"] = {"intra_fid": 120.0, "spread_ratio": 0.75}
        (results / name).mkdir()
        (results / name / "report.json").write_text(json.dumps(report))
    rows = table1.summarise(table1.collect(str(results)))
    row = next(r for r in rows if r["fake_rendering"] == "teacher_labels")
    assert row["runs"] == ["fmnist-eps1-tl", "fmnist-eps1-tl2"]
    assert row["quality"]["fid"] == {"n": 2, "mean": 75.0,
                                       "sd": pytest.approx(math.sqrt(50.0))}
    assert row["quality"]["label_agreement"] == {"n": 1, "mean": 0.5, "sd": None}
    assert row["quality"]["intra_fid"] == {"n": 1, "mean": 120.0, "sd": None}
    assert row["quality"]["spread_ratio"] == {"n": 1, "mean": 0.75, "sd": None}
    assert all(r["fake_rendering"] == "class_grid" for r in rows if r is not row)
    text = table1.render(table1.collect(str(results)))
    assert ("| fashion_mnist, eps = 1, index partition, fake batches rendered teacher_labels "
            "(the authors') | 0.6478 | 2 |") in text
    assert ("| 75.0 +- 7.1 (2 runs) | 0.500 (1 run) | 120.0 (1 run) | 0.75 (1 run) |"
            in text)
    assert "| 70.0 | 0.500 | 120.0 | 0.75 | index | teacher_labels |" in text
    assert "| 80.0 | -- | -- | -- | index | teacher_labels |" in text


def test_markdown_lists_every_run_and_marks_unfinished_protocols(results):
    text = table1.render(table1.collect(str(results)), figure="table1.png")
    balanced = "class-balanced partition (the authors'; epsilon NOT a proven guarantee)"
    assert (f"| fashion_mnist, eps = 1, {balanced} | 0.6478 | 3 | 0.4000 +- 0.1000 "
            f"(3 runs) |") in text
    assert f"| fashion_mnist, eps = 10, {balanced} | 0.7061 | 1 | 0.3700 (1 run) |" in text
    assert "unfinished (2 of 4 epochs)" in text and "not run" in text
    assert "fmnist-eps1-t50" not in text
    assert ("| -- | -- | class-balanced | class_grid | independent seed per layer | `abcdef0` "
            "| Test CPU |") in text
    assert "| not measured | not measured |" in text
    for line in text.splitlines():
        if line.startswith("|---"):
            continue
        if line.startswith("| row") or line.startswith("| run"):
            columns = line.count("|")
            separator = text.splitlines()[text.splitlines().index(line) + 1]
            assert separator.count("|") == columns, line


def test_section_is_replaced_between_the_markers_only(results, tmp_path):
    markdown = tmp_path / "README.md"
    markdown.write_text("# Results\n\nwritten by hand\n")
    table1.write_section(str(markdown), "first")
    table1.write_section(str(markdown), "second")
    text = markdown.read_text()
    assert text.startswith("# Results\n\nwritten by hand\n")
    assert "second" in text and "first" not in text and text.count(table1.BEGIN_MARK) == 1
    markdown.write_text(text + "\nafter the table\n")
    table1.write_section(str(markdown), "third")
    assert markdown.read_text().endswith("after the table\n")
    markdown.write_text(table1.BEGIN_MARK + "\nno end")
    with pytest.raises(ValueError, match="only one of the markers"):
        table1.write_section(str(markdown), "x")


def test_cli_writes_the_section_and_figure_and_refuses_bad_folders(results, tmp_path, capsys):
    cli = _cli()
    assert cli.main(["--results", str(results)]) == 0
    assert "0.4000 +- 0.1000" in (results / "README.md").read_text()
    assert (results / "table1.png").stat().st_size > 0
    assert cli.main(["--results", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["--results", str(empty)]) == 2
    assert "no paper-config report.json" in capsys.readouterr().err


def _tuned_report(name, seed, val, sen, *, learning_rate):
    """A paper-scale report of a tuned configuration (results/beyond/paper-scale/<run>)."""
    report = _report(name, 1, val, sen, paper_config=False)
    report["options"] = {"dataset": "fashion_mnist", "eps": 1, "seed": seed,
                         "training_records": "private"}
    report["config"] = {"budget": {"conversion": "classic"},
                        "train": {"training_records": "private"}}
    report["deviations"] = ["private records only"]
    report["evaluation"]["settings"] = {"schedule": {"learning_rate": learning_rate},
                                        "max_samples": 20000}
    return report


def test_tuned_paper_scale_runs_form_their_own_marked_row_after_the_papers(results, capsys):
    """results/README.md's table gains the tuned configurations run at the paper scale
    (results/beyond/paper-scale/): one row per configuration (seeds grouped, the scoring
    schedule part of the name), marked, after the paper-config rows, whose numbers stay."""
    paper_scale = results / "beyond" / "paper-scale"
    for name, seed, val, lr in (("tuned-seed1", 1, 0.60, 3e-5), ("tuned-seed2", 2, 0.64, 3e-5),
                                ("other-lr", 1, 0.41, 1e-4)):
        (paper_scale / name).mkdir(parents=True)
        (paper_scale / name / "report.json").write_text(json.dumps(
            _tuned_report(name, seed, val, 0.66, learning_rate=lr)))
    assert _cli().main(["--results", str(results)]) == 0
    text = (results / "README.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| fashion_mnist, eps")]
    assert len(rows) == 4                  # eps 1, eps 10, and the two tuned configurations
    assert "beyond the paper" not in rows[0] and "beyond the paper" not in rows[1]
    assert rows[0].split(" | ")[3] == "0.4000 +- 0.1000 (3 runs)"       # unchanged
    name = "fashion_mnist-eps1-private (classifier learning rate {}, 20000 samples)"
    assert f"**beyond the paper**: `{name.format('3e-05')}`" in rows[2] + rows[3]
    tuned = next(row for row in rows if name.format("3e-05") in row)
    assert tuned.split(" | ")[2:4] == ["2", "0.6200 +- 0.0283 (2 runs)"]
    assert "| `beyond/paper-scale/tuned-seed2` |" in text
    assert "A row marked **beyond the paper**" in text
    (paper_scale / "other-lr" / "report.json").write_text("{")
    assert _cli().main(["--results", str(results), "--print"]) == 2
    assert "other-lr" in capsys.readouterr().err


def _merf_records(folder, *, val, sen, epsilon, fid, cpu=None):
    """A DP-MERF paper-scale record (results/beyond/merf/<run>/), as scripts/merf.py and
    scripts/evaluate.py write it."""
    folder.mkdir(parents=True)
    (folder / "evaluation.json").write_text(json.dumps({
        "dataset": "fashion_mnist",
        "protocols": {"val": {"accuracy": val, "epoch": 2}, "sen": {"accuracy": sen}},
        "curves": {"epoch": [1, 2], "test_accuracy": [0.5, val]},
        "quality": {"fid": fid, "label_agreement": 0.75,
                    "per_class": {"intra_fid": 55.0, "spread_ratio": 0.7}}}))
    (folder / "privacy.json").write_text(json.dumps({
        "epsilon": {"epsilon": epsilon}, "conversion": "pld", "releases": 1,
        "training_records": "private"}))
    provenance = {"git": {"commit": "abcdef0123456789"}}
    if cpu is not None:
        provenance["machine"] = {"cpu": cpu, "cpu_vector_extensions": ["avx2", "avx512f"]}
    (folder / "config.json").write_text(json.dumps({"provenance": provenance}))


def test_another_methods_paper_scale_runs_form_their_own_marked_rows_last(results, capsys):
    """The headline table gains DP-MERF's paper-scale runs (results/beyond/merf/): one row
    per configuration, marked as another method, after every DataLens row, with no paper
    value (the paper has no DP-MERF row); the paper-config rows stay as they were."""
    merf = results / "beyond" / "merf"
    _merf_records(merf / "fashion_mnist-merf-eps1-private-lr3e-5-seed1", val=0.70, sen=0.72,
                  epsilon=0.9999, fid=50.0, cpu="AMD EPYC")
    _merf_records(merf / "fashion_mnist-merf-eps1-private-lr3e-5-seed2", val=0.80, sen=0.82,
                  epsilon=1.0, fid=46.0)
    assert _cli().main(["--results", str(results)]) == 0
    text = (results / "README.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| fashion_mnist, eps")]
    assert len(rows) == 3
    assert rows[0].split(" | ")[3] == "0.4000 +- 0.1000 (3 runs)"       # unchanged
    cells = rows[-1].split(" | ")
    assert cells[0] == ("| fashion_mnist, eps = 1, **beyond the paper, another method**: "
                        "DP-MERF, `fashion_mnist-merf-eps1-private-lr3e-5`")
    assert cells[1:5] == ["--", "2", "0.7500 +- 0.0707 (2 runs)", "0.7700 +- 0.0707 (2 runs)"]
    assert cells[7] == "48.0 +- 2.8 (2 runs)"
    assert "A row marked **another method** is not DataLens: DP-MERF" in text
    assert ("| `beyond/merf/fashion_mnist-merf-eps1-private-lr3e-5-seed1` | 0.9999 (1 release) "
            "| 0.7000 | 0.7200 |") in text
    assert "| `abcdef0` | AMD EPYC (AVX-512, AVX2) |" in text
    assert "| `abcdef0` | not recorded |" in text             # the run without a machine
    (merf / "fashion_mnist-merf-eps1-private-lr3e-5-seed2" / "privacy.json").write_text("{}")
    assert _cli().main(["--results", str(results), "--print"]) == 2
    assert "seed2 is not a readable DP-MERF record (no 'epsilon')" in capsys.readouterr().err

