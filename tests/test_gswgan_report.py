"""The GS-WGAN results table: what each row says its epsilon is worth, its scale against
the paper's config, numbers read from the run's own files, and safe publishing."""

from __future__ import annotations

import json

import pytest

from dclens.gswgan import report
from dclens.gswgan.config import GswganConfig
from conftest import load_script


def _write_run(folder, *, val=0.4, sen=0.5, authors=None, epsilon=9.5, proven=True,
               evaluated=True, **config):
    """A run folder as scripts/gswgan.py and scripts/evaluate.py leave it (the fields the
    table reads), with ``config`` overriding the paper's settings."""
    values = GswganConfig(**config).to_dict()
    accounting = values["accounting"]
    body = {"method": "gswgan", "config": values,
            "privacy": {"accounting": accounting, "accounting_proven": proven,
                        "delta": 1e-5, "sigma": 2.5, "reproducible_noise": False,
                        "epsilon": {"epsilon": epsilon, "delta": 1e-5},
                        "for_comparison": {"accounting": "per_sample_paper",
                                           "epsilon": epsilon / 5, "proven": False}}}
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps(body))
    (folder / "samples.npz").write_bytes(b"not copied")
    if evaluated:
        protocols = {"val": {"accuracy": val}, "sen": {"accuracy": sen}}
        if authors is not None:
            protocols["authors_range1"] = {"accuracy": authors}
        (folder / "evaluation.json").write_text(json.dumps(
            {"protocols": protocols, "quality": {"fid": 123.45, "label_agreement": 0.3}}))
    return folder


def test_each_row_says_what_its_epsilon_is_worth(tmp_path):
    results = tmp_path / "results"
    runs = {
        "proven": _write_run(tmp_path / "a", num_discriminators=200),
        "NOT proven": _write_run(tmp_path / "b", num_discriminators=200, proven=False,
                                 accounting="per_sample_paper"),
        "seeded noise, NOT private": _write_run(tmp_path / "d", num_discriminators=200,
                                                seed=3),
        "reference, NOT private": _write_run(tmp_path / "c", num_discriminators=1,
                                             epsilon=5715.0),
    }
    for kind, folder in runs.items():
        report.publish_run(str(folder), str(results))
        assert report.read_run(str(folder)).kind == kind
    table = report.render(report.collect(str(results)))
    rows = [line for line in table.splitlines() if line.startswith("| [")]
    assert [row.split(" | ")[1] for row in rows] == list(runs)      # proven first
    assert "| 5715 (1e-05, iteration) | discard |" in rows[3]
    assert "1.9 (per_sample_paper, NOT proven)" in rows[0]


def test_a_run_that_keeps_the_critic_updates_is_not_proven_whatever_it_wrote(tmp_path):
    """The released code's critic updates make the iteration accounting unproven; a run
    from before the setting existed (no ``critic_updates`` in its config) kept them, and
    its own ``accounting_proven: true`` must not make its row "proven"."""
    kept = _write_run(tmp_path / "kept", num_discriminators=200, critic_updates="keep")
    older = _write_run(tmp_path / "older", num_discriminators=200)
    body = json.loads((older / "report.json").read_text())
    del body["config"]["critic_updates"]
    (older / "report.json").write_text(json.dumps(body))
    fresh = _write_run(tmp_path / "fresh", num_discriminators=200)
    assert report.read_run(str(kept)).kind == "NOT proven"
    assert report.read_run(str(older)).kind == "NOT proven"
    assert report.read_run(str(older)).critic_updates.value == "keep"
    assert report.read_run(str(fresh)).kind == "proven"
    rows = [line for line in report.render([report.read_run(str(f)) for f in
                                            (kept, older, fresh)]).splitlines()
            if line.startswith("| [")]
    assert rows[0].startswith("| [fresh](fresh/) | proven |") and "| discard |" in rows[0]
    assert all("| NOT proven |" in row and "| keep |" in row for row in rows[1:])


def test_the_scale_column_names_every_setting_that_differs_from_the_paper():
    paper = GswganConfig().to_dict()
    assert report.scale_description(paper) == "paper config"
    small = dict(paper, num_discriminators=200, model_dim=8, iterations=500)
    assert report.scale_description(small) == ("N_D 200 (paper 1000), m 8 (64), "
                                               "DP it. 500 (20000)")
    assert report.scale_description(dict(paper, max_records=600)) == (
        "records 600 (paper all)")


def test_the_numbers_come_from_the_evaluation_file(tmp_path):
    folder = _write_run(tmp_path / "run", val=0.1234, sen=0.2345, authors=0.3456,
                        num_discriminators=200)
    table = report.render([report.read_run(str(folder))])
    assert "| 0.1234 | 0.2345 | 0.3456 | 123.5 | 0.300 |" in table
    without = _write_run(tmp_path / "other", num_discriminators=200)
    assert "| 0.4000 | 0.5000 | -- | 123.5 |" in report.render(
        [report.read_run(str(without))])


def test_publishing_refuses_unfinished_unevaluated_foreign_and_other_runs(tmp_path):
    results = str(tmp_path / "results")
    (tmp_path / "empty").mkdir()
    with pytest.raises(report.ReportError, match="has not finished"):
        report.publish_run(str(tmp_path / "empty"), results)
    unevaluated = _write_run(tmp_path / "u", evaluated=False)
    with pytest.raises(report.ReportError, match="evaluate it first: python scripts/"
                       "evaluate.py .*samples.npz --protocol authors"):
        report.publish_run(str(unevaluated), results)
    foreign = _write_run(tmp_path / "f")
    (foreign / "report.json").write_text(json.dumps({"method": "gep"}))
    with pytest.raises(report.ReportError, match="'gep' report, not a GS-WGAN one"):
        report.publish_run(str(foreign), results)

    run = _write_run(tmp_path / "r", val=0.4)
    target = report.publish_run(str(run), results)
    assert sorted(p.name for p in (tmp_path / "results" / "r").iterdir()) == [
        "evaluation.json", "report.json"]                      # the samples stay behind
    # Evaluated again (the authors' protocol added): published again, replaced.
    _write_run(tmp_path / "again" / "r", val=0.4, authors=0.6)
    (run / "evaluation.json").write_text((tmp_path / "again" / "r" /
                                          "evaluation.json").read_text())
    assert report.publish_run(str(run), results) == target
    assert report.read_run(target).protocol("authors_range1") == 0.6
    # Another run under the same name is refused, and the published copy is kept.
    other = _write_run(tmp_path / "x" / "r", epsilon=1.0)
    with pytest.raises(report.ReportError, match="exists with other content"):
        report.publish_run(str(other), results)
    assert report.read_run(target).epsilon == 9.5


def test_the_hand_written_text_is_kept_and_the_cli_names_errors(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    (results / "README.md").write_text("# Hand-written\n\nkept.\n")
    cli = load_script("gswgan_report")
    run = _write_run(tmp_path / "run", num_discriminators=200)
    assert cli.main(["add", str(run), "--results", str(results)]) == 0
    text = (results / "README.md").read_text()
    assert text.startswith("# Hand-written\n\nkept.\n") and report.BEGIN_MARK in text
    assert "[run](run/)" in text
    assert cli.main(["add", str(tmp_path / "missing"), "--results", str(results)]) == 2
    assert "has no report.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["render", str(run)])
    assert "render takes no folders" in capsys.readouterr().err


def test_every_committed_run_says_in_its_own_files_whether_its_epsilon_is_proven():
    """Published artifacts carry their own truth: each results/gswgan run's privacy.json,
    config.json and report.json give the accounting_proven that the rule (accounting and
    critic updates, an older run's missing setting read as 'keep') gives -- not only the
    table that reads them."""
    from pathlib import Path

    from dclens.gswgan.accounting import Accounting, CriticUpdates, is_proven
    from dclens.gswgan.config import IMPLIED_BY_OLDER_RUNS

    runs = sorted(p.parent for p in (Path(__file__).parent.parent / "results" / "gswgan")
                  .glob("*/privacy.json"))
    assert len(runs) >= 6
    for run in runs:
        files = {name: json.loads((run / name).read_text())
                 for name in ("privacy.json", "config.json", "report.json")}
        settings = files["config.json"]["config"]
        updates = CriticUpdates(settings.get("critic_updates",
                                             IMPLIED_BY_OLDER_RUNS["critic_updates"]))
        want = is_proven(Accounting(files["privacy.json"]["accounting"]), updates)
        for name, said in (("privacy.json", files["privacy.json"]),
                           ("config.json", files["config.json"]),
                           ("report.json", files["report.json"]["privacy"])):
            assert said["accounting_proven"] is want, (run.name, name)
