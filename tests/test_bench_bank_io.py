"""scripts/bench_bank_io.py end to end at a tiny size: the bytes it counts, and a bank that
streams through it unchanged (the timings themselves are a benchmark's, never asserted)."""

from __future__ import annotations

import json

import numpy as np

from dclens.cli import bench_bank_io
from dclens.datalens import networks, teacher_bank, teachers
from dclens.experiments import bank_io


def test_a_pass_moves_every_row_twice_and_leaves_the_bank_as_it_was(tmp_path):
    layout = teachers.ParamLayout.for_shape(networks.ImageShape(8, 8, 3, 2))
    bank = teacher_bank.TeacherBank.create(layout, 5, seed=2, directory=tmp_path)
    before = [np.array(getattr(bank, name)) for name in ("weights", "adam_m", "adam_v")]
    bank_io.stream_pass(bank, chunk=2)
    for name, want in zip(("weights", "adam_m", "adam_v"), before):
        np.testing.assert_array_equal(getattr(bank, name), want)


def test_the_cli_reports_both_modes_per_pass(tmp_path, capsys):
    out = tmp_path / "io.json"
    assert bench_bank_io.main(["--teachers", "3", "--chunk", "2", "--passes", "2",
                               "--dir", str(tmp_path), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == report
    layout = teachers.ParamLayout.for_shape(networks.ImageShape(28, 28, 1, 10))
    moved = 2 * 3 * 3 * teacher_bank.padded_columns(layout.size) * 4 / 2 ** 30
    assert [r["mode"] for r in report["results"]] == ["buffered", "direct"]
    assert report["results"][0]["direct_io"] is False
    for result in report["results"]:
        assert abs(result["gib_moved_per_pass"] - moved) < 1e-12
        assert len(result["passes"]) == 2
        for one in result["passes"]:
            assert one["wall_seconds"] > 0 and one["process_cpu_seconds"] >= 0
    assert not list(tmp_path.glob("dclens-bank-io-*"))         # the banks are removed


def test_the_cli_refuses_a_bank_larger_than_the_disk_by_name(tmp_path, capsys):
    assert bench_bank_io.main(["--teachers", "100000000", "--dir", str(tmp_path)]) == 2
    assert "--teachers fewer" in capsys.readouterr().err
