"""The paper's analysis tables (dclens/tables.py, scripts/tables.py) on a tiny scale."""

import json

import pytest

from dclens import classifiers, evaluate, reproduce, tables
from conftest import load_script

cli = load_script("tables")


def test_dry_run_lists_every_row_with_its_change(capsys):
    assert cli.main(["fashion_mnist", "--table", "7", "--teachers", "400", "--dry_run"]) == 0
    out = capsys.readouterr().out
    for name in ("fashion_mnist-eps1-t400 ", "fashion_mnist-eps1-t400-no_topk",
                 "fashion_mnist-eps1-t400-topk_sign", "fashion_mnist-eps1-t400-b0"):
        assert name in out
    assert "results/tables/table7-fashion_mnist-t400" in out


def test_table_4t_rows_set_their_own_teachers():
    base = reproduce.ReproduceOptions(dataset="fashion_mnist", eps=1, scale=0.1)
    names = [tables.row_options(base, row).default_name() for row in tables.TABLES["4t"][1]]
    assert names == ["fashion_mnist-eps1-t2000", "fashion_mnist-eps1-t3000",
                     "fashion_mnist-eps1"]


def test_a_tiny_table_runs_every_row_and_reads_finished_rows_back(tiny_fmnist_dir, tmp_path):
    base = reproduce.ReproduceOptions(dataset="fashion_mnist", eps=1, teachers=4,
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


def test_tables_are_at_epsilon_one():
    with pytest.raises(reproduce.ReproduceError, match="epsilon = 1"):
        tables.run_table("7", reproduce.ReproduceOptions(dataset="fashion_mnist", eps=10),
                         out_dir="unused")
