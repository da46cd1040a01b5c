"""The paper's analysis tables (dclens/experiments/tables.py, scripts/tables.py) on a tiny scale."""

import dataclasses
import json
import pathlib
import shutil

import numpy as np
import pytest

from dclens.evaluation import classifiers, evaluate
from dclens.experiments import tables
from dclens.experiments import paper_rows
from conftest import load_script

cli = load_script("tables")


def test_dry_run_lists_every_row_with_its_change(capsys):
    assert cli.main(["fashion_mnist", "--table", "7", "--teachers", "400", "--dry_run"]) == 0
    out = capsys.readouterr().out
    for name in ("fashion_mnist-eps1-t400 ", "fashion_mnist-eps1-t400-no_topk",
                 "fashion_mnist-eps1-t400-topk_sign", "fashion_mnist-eps1-t400-b0"):
        assert name in out
    assert "results/tables/table7-fashion_mnist-t400" in out


def test_table_4t_rows_set_their_teachers_in_proportion_to_the_shared_scale():
    def names(**shared):
        base = paper_rows.ReproduceOptions(dataset="fashion_mnist", eps=1, **shared)
        return [tables.row_options(base, row).default_name()
                for row in tables.TABLES["4t"][1]]

    assert names() == ["fashion_mnist-eps1-t2000", "fashion_mnist-eps1-t3000",
                       "fashion_mnist-eps1"]
    assert names(scale=0.1) == ["fashion_mnist-eps1-t200", "fashion_mnist-eps1-t300",
                                "fashion_mnist-eps1-t400"]
    assert names(teachers=200, sigma_scale=0.05) == [
        "fashion_mnist-eps1-t100-sigma0.05", "fashion_mnist-eps1-t150-sigma0.05",
        "fashion_mnist-eps1-t200-sigma0.05"]


def test_matched_noise_scales_sigma_with_the_teachers_and_the_table_says_so(capsys):
    base = paper_rows.ReproduceOptions(dataset="fashion_mnist", eps=1, teachers=200)
    matched = tables.matched_noise(base)
    assert matched.sigma_scale == 200 / 4000
    with pytest.raises(paper_rows.ReproduceError, match="give --teachers N < 4000"):
        tables.matched_noise(paper_rows.ReproduceOptions(dataset="fashion_mnist", eps=1))
    summary = {"title": "t", "dataset": "fashion_mnist",
               "options": dataclasses.asdict(matched),
               "rows": [tables._row_entry(row, tables.row_options(matched, row),
                                          "fashion_mnist", None)
                        for row in tables.TABLES["7"][1]]}
    budget = paper_rows.matched_budget("fashion_mnist", 1, 250.0)
    markdown = tables.render(summary)
    assert "NOT epsilon = 1" in markdown and f"epsilon {budget:.4g}" in markdown
    assert "NOT epsilon" not in tables.render(dict(summary,
                                                   options=dataclasses.asdict(base)))
    assert cli.main(["fashion_mnist", "--table", "7", "--teachers", "200", "--matched_noise",
                     "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert "fashion_mnist-eps1-t200-no_topk-sigma0.05" in out
    with pytest.raises(SystemExit):
        cli.main(["fashion_mnist", "--table", "7", "--matched_noise", "--dry_run"])
    assert "give --teachers N < 4000" in capsys.readouterr().err


def test_a_tiny_table_runs_every_row_and_reads_finished_rows_back(tiny_fmnist_dir, tmp_path):
    base = paper_rows.ReproduceOptions(dataset="fashion_mnist", eps=1, teachers=4,
                                      max_records=80, num_samples=60, epochs=1,
                                      data_dir=str(tiny_fmnist_dir))
    settings = evaluate.EvalSettings(schedule=classifiers.Schedule(epochs=1, batch_size=16),
                                     quality=False)
    kwargs = dict(out_dir=str(tmp_path / "table"), run_root=str(tmp_path / "runs"),
                  log=lambda _: None, settings=settings, reference=False, progress=False)
    summary = tables.run_table("7", base, **kwargs)
    assert [r["row"] for r in summary["rows"]] == [r.label for r in tables.TABLES["7"][1]]
    assert [r["paper"] for r in summary["rows"]] == [0.6478, 0.4775, 0.6159, 0.5859]
    configs = [json.loads((tmp_path / "table" / r["name"] / "report.json").read_text())
               ["config"]["topagg"] for r in summary["rows"]]
    assert [c["method"] for c in configs] == ["topk_stochastic_sign", "no_topk", "topk_sign",
                                              "topk_stochastic_sign"]
    assert configs[3]["thresh"] == 0.0
    text = (tmp_path / "table" / "table.md").read_text()
    assert "0.6478" in text and "- top-k" in text
    # A second call reads the finished rows (nothing is trained again).
    again = tables.run_table("7", base, **kwargs)
    assert [r["val"] for r in again["rows"]] == [r["val"] for r in summary["rows"]]
    # A finished row is read back only if it is the row's run: the "- top-k" row's report
    # put in the full row's place (another mechanism), or one from another partition, is
    # refused with the differing fields; a different teacher chunk (memory only) is not.
    full = tmp_path / "table" / summary["rows"][0]["name"] / "report.json"
    original = full.read_text()
    report = json.loads(original)
    report["config"]["train"]["teacher_chunk"] += 1
    full.write_text(json.dumps(report))
    assert tables.run_table("7", base, **kwargs)["rows"][0]["val"] == summary["rows"][0]["val"]
    full.write_text((tmp_path / "table" / summary["rows"][1]["name"] / "report.json")
                    .read_text())
    with pytest.raises(paper_rows.ReproduceError,
                       match="not this row's run: topagg.method: 'no_topk' "
                             "\\(row: 'topk_stochastic_sign'\\)"):
        tables.run_table("7", base, **kwargs)
    report = json.loads(original)
    report["config"]["train"]["balanced_partition"] = True
    full.write_text(json.dumps(report))
    with pytest.raises(paper_rows.ReproduceError, match="train.balanced_partition: True"):
        tables.run_table("7", base, **kwargs)
    # A report written before a config field existed (key absent) means its default:
    # read back; the same field set away from the default is refused.
    report = json.loads(original)
    del report["config"]["train"]["class_guidance"]
    full.write_text(json.dumps(report))
    assert tables.run_table("7", base, **kwargs)["rows"][0]["val"] == summary["rows"][0]["val"]
    report["config"]["train"]["class_guidance"] = 1.0
    full.write_text(json.dumps(report))
    with pytest.raises(paper_rows.ReproduceError, match="train.class_guidance: 1.0"):
        tables.run_table("7", base, **kwargs)


def test_a_table_runs_only_the_rows_asked_for_and_shares_them_with_other_tables(
        tiny_fmnist_dir, tmp_path, capsys):
    """``only`` trains the named row and leaves the others "not run" (in table.json and
    table.md, written as the table stands); another table with the same row copies it
    instead of training it; ``train=False`` only renders; an unknown row name is refused
    with the table's row names."""
    base = paper_rows.ReproduceOptions(dataset="fashion_mnist", eps=1, teachers=4,
                                      max_records=80, num_samples=60, epochs=1,
                                      data_dir=str(tiny_fmnist_dir))
    settings = evaluate.EvalSettings(schedule=classifiers.Schedule(epochs=1, batch_size=16),
                                     quality=False)
    runs = tmp_path / "runs"
    kwargs = dict(run_root=str(runs), log=lambda _: None, settings=settings,
                  reference=False, progress=False)
    seven, four_b = tmp_path / "tables" / "table7", tmp_path / "tables" / "table4b"
    names = tables.table_row_names("7", base)
    with pytest.raises(paper_rows.ReproduceError, match=f"no row named 'nope'.*{names[1]}"):
        tables.run_table("7", base, out_dir=str(seven), only=["nope"], **kwargs)
    summary = tables.run_table("7", base, out_dir=str(seven), only=[names[3]], **kwargs)
    assert [r["status"] for r in summary["rows"]] == ["not run"] * 3 + ["finished"]
    assert sorted(p.name for p in runs.iterdir()) == [names[3]]
    saved = json.loads((seven / "table.json").read_text())
    assert [r["status"] for r in saved["rows"]] == ["not run"] * 3 + ["finished"]
    text = (seven / "table.md").read_text()
    assert "1 of 4 rows finished" in text
    assert text.count("| not run | not run | not run |") == 3
    assert f"{summary['rows'][3]['val']:.4f}" in text
    # Table 4(b) has the same row (beta = 0): rendering it trains nothing and copies the
    # finished row, byte for byte; its other rows are not run.
    shared = tables.run_table("4b", base, out_dir=str(four_b), train=False, **kwargs)
    assert [r["status"] for r in shared["rows"]] == ["finished"] + ["not run"] * 5
    assert shared["rows"][0]["name"] == names[3]
    assert shared["rows"][0]["val"] == summary["rows"][3]["val"]
    assert ((four_b / names[3] / "report.json").read_bytes()
            == (seven / names[3] / "report.json").read_bytes())
    assert sorted(p.name for p in runs.iterdir()) == [names[3]]
    # The CLI: --render and --row are exclusive; an unknown row is an error, not a run.
    with pytest.raises(SystemExit):
        cli.main(["fashion_mnist", "--table", "7", "--render", "--row", names[0]])
    assert "give one of them" in capsys.readouterr().err
    assert cli.main(["fashion_mnist", "--table", "7", "--row", "fashion_mnist-eps1-nope",
                     "--out", str(tmp_path / "unused")]) == 2
    assert "no row named 'fashion_mnist-eps1-nope'" in capsys.readouterr().err


def test_tables_are_at_epsilon_one():
    with pytest.raises(paper_rows.ReproduceError, match="epsilon = 1"):
        tables.run_table("7", paper_rows.ReproduceOptions(dataset="fashion_mnist", eps=10),
                         out_dir="unused")


def _bench_result(aggregation, seconds, voting, noise, config="fmnist-eps1-4000"):
    return {"config": config, "aggregation": aggregation,
            "measured": {"num_teachers": 200, "cpu_share_of_machine": seconds / 100},
            "extrapolated": {"num_teachers": 4000, "seconds_per_step": seconds,
                             "phases_seconds": {"voting": voting, "noise": noise}}}


BENCH_MACHINE = {"cpu_model": "test CPU", "cpus": 2, "tensorflow": "x", "onednn_enabled": True}


def test_table6_ratios_from_a_bench_report(tmp_path, capsys):
    """Ours / TopAgg within the bench report, the paper's within the paper's column (by hand:
    Fashion-MNIST 471.02 / 340.84 and 775.35 / 340.84); a mechanism not in Table 6 is listed
    without a paper value."""
    report = {"machine": BENCH_MACHINE, "results": [
        _bench_result("topk_stochastic_sign", 60.0, 1.0, 0.5),
        _bench_result("klevel", 66.0, 2.0, 0.5),
        _bench_result("fetchsgd", 75.0, 1.0, 9.0),
        _bench_result("no_topk", 63.0, 3.0, 0.5)]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(report))
    assert cli.main(["fashion_mnist", "--table", "6", "--bench", str(path),
                     "--out", str(tmp_path / "t6")]) == 0
    summary = json.loads((tmp_path / "t6" / "table.json").read_text())
    by = {r["aggregation"]: r for r in summary["rows"]}
    assert by["klevel"]["ratio_to_topagg"] == pytest.approx(1.1)
    assert by["fetchsgd"]["ratio_to_topagg"] == pytest.approx(1.25)
    assert by["fetchsgd"]["vote_and_release_seconds"] == pytest.approx(10.0)
    assert by["klevel"]["paper_ratio_to_topagg"] == pytest.approx(471.02 / 340.84)
    assert by["fetchsgd"]["paper_ratio_to_topagg"] == pytest.approx(775.35 / 340.84)
    assert by["no_topk"]["paper_seconds_per_epoch"] is None
    assert by["no_topk"]["row"] == "no_topk (not in Table 6)"
    text = (tmp_path / "t6" / "table.md").read_text()
    assert "| FetchSGD (proven accounting) | 4000 (200) | 75.0 | 1.25 | 10.00 | 775.4 | 2.27 |" \
        in text
    assert "test CPU with 2 cores" in text
    assert "had 0.60-0.75 of the machine's CPU time" in text
    assert "FetchSGD (proven accounting): 75.0 s/epoch, 1.25x TopAgg" in capsys.readouterr().out


def test_table6_refuses_reports_it_cannot_compare(tmp_path, capsys):
    def write(results):
        path = tmp_path / "bench.json"
        path.write_text(json.dumps({"machine": BENCH_MACHINE, "results": results}))
        return str(path)

    cases = [([_bench_result("klevel", 66.0, 2.0, 0.5)], "no TopAgg run"),
             ([_bench_result("topk_stochastic_sign", 60.0, 1.0, 0.5),
               _bench_result("klevel", 66.0, 2.0, 0.5, config="fmnist-200")],
              "at one configuration"),
             ([{"config": "fmnist-eps1-4000", "aggregation": "fetchsgd",
                "error": "RuntimeError: boom"}], "fetchsgd failed: RuntimeError: boom")]
    for results, message in cases:
        assert cli.main(["fashion_mnist", "--table", "6", "--bench", write(results),
                         "--out", str(tmp_path / "t6")]) == 2
        assert message in capsys.readouterr().err
    assert cli.main(["fashion_mnist", "--table", "6", "--bench", str(tmp_path / "none.json"),
                     "--out", str(tmp_path / "t6")]) == 2
    assert "cannot read the bench report" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["fashion_mnist", "--table", "7", "--bench", write([])])
    assert "--bench FILE goes with --table 6" in capsys.readouterr().err


def test_a_matched_row_accounted_by_pld_runs_the_steps_pld_gives_the_paper_config():
    """The noise-matched small model of "the paper config accounted by pld": the paper's
    sigma relative to the vote sum and the steps pld allows the paper config at epsilon 1
    (more than the classic conversion's), under the budget those steps cost here."""
    from dclens.privacy import accounting

    def steps_of(options):
        config, deviations = paper_rows.build_config(options)
        orders = (accounting.classic_orders(config.budget.max_order)
                  if config.budget.conversion is accounting.Conversion.CLASSIC else None)
        return config, deviations, accounting.max_steps_within(
            sigma=config.topagg.sigma, topk=config.topagg.topk, queries_per_step=15,
            max_eps=config.budget.max_eps, delta=config.budget.delta,
            conversion=config.budget.conversion, orders=orders)

    base = paper_rows.ReproduceOptions("fashion_mnist", 1, teachers=200, max_records=3000)
    classic, _, classic_steps = steps_of(tables.matched_noise(base))
    pld, deviations, pld_steps = steps_of(tables.matched_noise(
        dataclasses.replace(base, conversion="pld")))
    paper_classic = paper_rows.paper_steps("fashion_mnist", 1)
    paper_pld = paper_rows.paper_steps("fashion_mnist", 1, accounting.Conversion.PLD)
    assert paper_pld > paper_classic
    assert (classic_steps, pld_steps) == (paper_classic, paper_pld)
    assert pld.topagg.sigma == classic.topagg.sigma
    assert pld.budget.max_eps > classic.budget.max_eps
    assert any(f"runs the paper's {paper_pld} steps under the pld conversion" in d
               for d in deviations)


def test_a_repeated_row_shows_the_mean_and_sd_of_its_runs():
    """--repeats N: the runs after the first are named -rep2, ...; the row's entry is the
    mean of its runs with their sd, rendered so; one run stays a plain number."""
    base = paper_rows.ReproduceOptions("fashion_mnist", 1, teachers=200, max_records=3000,
                                       training_records="tuning")
    row = tables.TABLES["levers"][1][1]
    runs = tables.repeated(tables.row_options(base, row), 3)
    names = [run.default_name() for run in runs]
    assert names[1:] == [names[0] + "-rep2", names[0] + "-rep3"]
    assert paper_rows.build_config(runs[2])[0] == paper_rows.build_config(runs[0])[0]
    with pytest.raises(paper_rows.ReproduceError, match="an integer >= 2, got 1"):
        dataclasses.replace(runs[0], repeat=1)

    def report(val, sen, steps=149):
        return {"accuracy": {"val": val, "sen": sen}, "quality": {"label_agreement": 0.25},
                "privacy": {"steps": steps, "epsilon": {"epsilon": 36.4}},
                "seconds": {"train": 600.0}, "partition_size": 15, "batch": 15,
                "deviations": ["d"]}

    values = [(0.30, 0.50), (0.40, 0.60), (0.35, 0.58)]
    entry = tables._row_entry(row, runs[0], "fashion_mnist", [report(*v) for v in values])
    assert entry["runs"] == 3
    assert entry["val"] == pytest.approx(np.mean([v for v, _ in values]))
    assert entry["val_sd"] == pytest.approx(np.std([v for v, _ in values], ddof=1))
    assert entry["sen"] == pytest.approx(np.mean([s for _, s in values]))
    assert tables._accuracy_cell(entry, "val") == (
        f"{entry['val']:.4f} +- {entry['val_sd']:.4f} (3 runs)")
    single = tables._row_entry(row, runs[0], "fashion_mnist", report(0.3, 0.5))
    assert single["runs"] == 1 and tables._accuracy_cell(single, "val") == "0.3000"
    with pytest.raises(SystemExit):
        cli.main(["fashion_mnist", "--table", "levers", "--teachers", "200",
                  "--training_records", "tuning", "--repeats", "0", "--dry_run"])


def _committed_screen(tmp_path: pathlib.Path):
    """A copy of the committed levers screen (results/beyond/levers-fashion_mnist-t200)
    and the options it was run with."""
    source = (pathlib.Path(__file__).resolve().parents[1] / "results" / "beyond"
              / "levers-fashion_mnist-t200")
    out = tmp_path / "levers"
    shutil.copytree(source, out)
    return out, tables.matched_noise(paper_rows.ReproduceOptions(
        "fashion_mnist", 1, teachers=200, max_records=3000, num_samples=20000,
        training_records="tuning"))


def test_a_table_regenerated_without_repeats_keeps_every_finished_repeat(tmp_path):
    """The committed levers screen has several runs of its first row; regenerating the
    table with the default --repeats 1 (as a later --row call does) must still show all."""
    out, base = _committed_screen(tmp_path)
    summary = tables.run_table("levers", base, out_dir=str(out), train=False,
                               log=lambda _: None)
    first = summary["rows"][0]
    names = [first["name"]]
    while (out / f"{first['name']}-rep{len(names) + 1}" / "report.json").exists():
        names.append(f"{first['name']}-rep{len(names) + 1}")
    assert len(names) >= 2
    assert first["runs"] == len(names) and first["val_sd"] is not None
    reports = [json.loads((out / name / "report.json").read_text()) for name in names]
    assert first["val"] == pytest.approx(np.mean([r["accuracy"]["val"] for r in reports]))
    assert f"({len(names)} runs)" in (out / "table.md").read_text()


def test_a_rows_name_with_repeats_selects_its_missing_runs_and_nothing_else(tmp_path,
                                                                           monkeypatch):
    """``--row NAME --repeats N`` trains NAME's runs that have not finished (the committed
    screen has NAME, NAME-rep2, ...: with N one more than those, only the missing one),
    ``NAME-repN`` selects that run alone, and other rows are never trained; with only the
    finished runs asked for (or without --repeats) nothing is trained."""
    out, base = _committed_screen(tmp_path)
    trained = []
    monkeypatch.setattr(tables.reproduce, "reproduce",
                        lambda options, **_: trained.append(options.default_name()))
    first = tables.row_options(base, tables.TABLES["levers"][1][0]).default_name()
    finished = 1
    while (out / f"{first}-rep{finished + 1}" / "report.json").exists():
        finished += 1
    assert (out / first / "report.json").exists() and finished >= 2
    missing = f"{first}-rep{finished + 1}"
    for only, repeats, expected in (([first], finished + 1, [missing]),
                                    ([missing], finished + 1, [missing]),
                                    ([first], finished, []), ([first], 1, [])):
        trained.clear()
        tables.run_table("levers", base, out_dir=str(out), only=only, repeats=repeats,
                         log=lambda _: None)
        assert trained == expected


def test_the_cli_pauses_a_row_on_ctrl_c_and_says_how_to_go_on(monkeypatch, tmp_path, capsys):
    """tables.py hands every row's training a GracefulStop (Ctrl-C: a checkpoint at the
    step's end); the pause ends the table with one line naming the command, status 130."""
    from dclens.cli.graceful_stop import GracefulStop
    from dclens.datalens.run import RunPaused

    seen = {}

    def paused_table(table, base, **kwargs):
        seen.update(kwargs)
        raise RunPaused(7)

    monkeypatch.setattr(tables, "run_table", paused_table)
    argv = ["fashion_mnist", "--table", "7", "--teachers", "200", "--quiet",
            "--out", str(tmp_path / "table7")]
    assert cli.main(argv) == 130
    assert isinstance(seen["training_stop"], GracefulStop)
    assert capsys.readouterr().err.strip() == (
        "tables.py: interrupted (paused at step 7); the finished rows are kept, and the same "
        "command goes on from them (a row's run resumes from its checkpoint): python "
        "scripts/tables.py " + " ".join(argv))
