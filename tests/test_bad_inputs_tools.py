"""The bad-input matrix of the other command-line tools (tests/test_bad_inputs.py holds
scripts/main.py's): every bad input gets its exact error and exit status 2, no traceback,
and nothing is written.

Each row names a tool, the flags added to that tool's small valid command (``TOOLS``),
what is prepared in the test's folder first, and the exact last line printed on stderr
(``{tmp}``: the test's folder, ``{data}``: the tiny Fashion-MNIST, ``{out}``: the tool's
output, are substituted).  After the call the folder is byte for byte what it was, and
the tool's outputs that did not exist before still do not.

No row starts any training: the trainers refuse before their run directory is made,
tables.py runs under --render (it never trains), and side_by_side.py is pointed at an
authors' repository that is not there, so a value it failed to refuse would end in that
error instead of minutes of TF1 training.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import pathlib
from typing import Callable

import numpy as np
import pytest

from dclens.common import export
from dclens.cli.dpsgd_flags import config_from_args
from dclens.experiments import paper_rows
from dclens.gswgan.config import GswganConfig
from dclens.runs import output_checks
from conftest import load_script, run_tool, snapshot, write_idx

USAGE = 2           # every tool's exit status for a bad flag, path or input file

SAMPLES = "{tmp}/samples/samples.npz"


def write_samples(tmp: pathlib.Path, folder: str = "samples") -> None:
    """30 samples as scripts/main.py writes them (``{tmp}/<folder>/samples.npz``), for
    evaluate.py."""
    rng = np.random.default_rng(0)
    export.write_samples_npz(tmp / folder / "samples.npz",
                             rng.random((30, 28, 28, 1), dtype=np.float32),
                             np.arange(30) % 10)


def paper_config_report() -> dict:
    """A report.json as reproduce.py writes it, reduced to what table1.py reads."""
    return {"name": "fmnist-eps1", "dataset": "fashion_mnist", "eps": 1, "paper_config": True,
            "accuracy": {"paper": 0.6478}, "privacy": {"epsilon": {"epsilon": 0.99},
                                                       "steps": 86},
            "provenance": {"commit": "abcdef0123", "machine": {"cpu": "Test CPU"}},
            "evaluation": {"protocols": {"val": {"accuracy": 0.3, "epoch": 2},
                                         "sen": {"accuracy": 0.4, "epoch": 1}},
                           "curves": {"epoch": [1, 2], "test_accuracy": [0.4, 0.3]}}}


def write_results(tmp: pathlib.Path) -> None:
    """One paper-config report under results/, and the (empty) folder of --markdown."""
    folder = tmp / "results" / "fmnist-eps1"
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps(paper_config_report()))
    (tmp / "site").mkdir()


def write_screening_runs(tmp: pathlib.Path) -> None:
    """{tmp}/screen (trained on the tuning split) and {tmp}/private (not), each with 30
    samples and the config.json a run writes, for tune_classifier.py."""
    for name, records in (("screen", "tuning"), ("private", "private")):
        write_samples(tmp, name)
        (tmp / name / "config.json").write_text(json.dumps({"config": {"train": {
            "dataset": "fashion_mnist", "training_records": records}}}))


@dataclasses.dataclass(frozen=True)
class Tool:
    """A tool's small valid command and the outputs a refused call must not create."""

    module: str                                 # dclens.cli.<module>
    valid: tuple[str, ...]
    out: str = "out"                            # {out}, relative to the test's folder
    outputs: tuple[str, ...] = ("{out}",)
    setup: Callable[[pathlib.Path], None] | None = None


TOOLS = {
    "evaluate": Tool("evaluate", ("--dataset", "fashion_mnist", "--data_dir", "{data}",
                                  "--epochs", "1", "--no_quality", "--quiet", "--out", "{out}"),
                     setup=write_samples),
    "privacy": Tool("privacy", ("--topk", "200", "--queries_per_step", "30"), outputs=()),
    "privacy gswgan": Tool("privacy", ("gswgan", "--iterations", "2000",
                                       "--num_discriminators", "100"), outputs=()),
    "dpsgd": Tool("dpsgd", ("--run_dir", "{out}", "--data_dir", "{data}", "--batch_size", "20",
                            "--epochs", "1", "--validation", "20", "--seed", "5", "--quiet")),
    "gswgan": Tool("gswgan", ("--run_dir", "{out}", "--data_dir", "{data}",
                              "--num_discriminators", "4", "--model_dim", "2", "--batch_size",
                              "6", "--critic_iters", "1", "--warm_iterations", "0",
                              "--iterations", "4", "--num_samples", "20", "--seed", "1",
                              "--quiet")),
    "side_by_side": Tool("side_by_side", ("--authors_repo", "{tmp}/authors-datalens",
                                          "--steps", "2", "--teachers", "2", "--records", "10",
                                          "--out", "{out}"), out="side_by_side.json"),
    "reproduce": Tool("reproduce", ("fashion_mnist", "--eps", "1", "--teachers", "4",
                                    "--max_records", "80", "--num_samples", "60",
                                    "--train_epochs", "1", "--seed", "3", "--teacher_chunk",
                                    "4", "--data_dir", "{data}", "--out", "{out}", "--run_dir",
                                    "{tmp}/run", "--cache_dir", "{tmp}/cache", "--quiet",
                                    "--epochs", "1", "--batch_size", "16", "--no_quality"),
                      outputs=("{out}", "{tmp}/run")),
    "tables": Tool("tables", ("fashion_mnist", "--table", "7", "--teachers", "4",
                              "--max_records", "80", "--train_epochs", "1", "--data_dir",
                              "{data}", "--out", "{out}", "--render", "--quiet")),
    "tables 6": Tool("tables", ("fashion_mnist", "--table", "6", "--bench", "{tmp}/bench.json",
                                "--out", "{out}")),
    "table1": Tool("table1", ("--results", "{tmp}/results", "--markdown", "{out}"),
                   out="site/README.md", outputs=("{out}", "{tmp}/site/table1.png"),
                   setup=write_results),
    "tune_classifier": Tool("tune_classifier", ("{tmp}/screen", "--epochs", "1", "--quiet",
                                                "--out", "{out}"),
                            setup=write_screening_runs),
}


# ------------------------------------------------------------------ what rows prepare

def damaged_data(names: dict[str, str]) -> None:
    """{tmp}/data/fashion_mnist with a truncated training images file."""
    folder = pathlib.Path(names["tmp"]) / "data" / "fashion_mnist"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split in ("train", "t10k"):
        write_idx(folder / f"{split}-images-idx3-ubyte.gz",
                  rng.integers(0, 255, size=(60, 28, 28)))
        write_idx(folder / f"{split}-labels-idx1-ubyte.gz", np.arange(60) % 10)
    path = folder / "train-images-idx3-ubyte.gz"
    raw = gzip.open(path).read()
    with gzip.open(path, "wb") as stream:
        stream.write(raw[:1000])


def _saved_run(folder: str, content: dict) -> None:
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w") as stream:
        json.dump(content, stream)


def gswgan_run(names: dict[str, str], where: str = "{out}") -> None:
    """A GS-WGAN run directory (its config.json)."""
    config = GswganConfig(sigma=1.0, target_eps=None)
    _saved_run(where.format(**names), {"config": config.to_dict(), "kind": "gswgan"})


def dpsgd_run(names: dict[str, str], *changes: str) -> None:
    """A private-classifier run of dpsgd's valid command with ``changes`` added."""
    tool = load_script("dpsgd")
    argv = [flag.format(**names) for flag in TOOLS["dpsgd"].valid]
    config = config_from_args(tool.build_parser().parse_args([*argv, *changes]))
    _saved_run(names["out"], {"config": config.to_dict(), "kind": "dpsgd"})


def datalens_run_with_beta_02(names: dict[str, str]) -> None:
    """A DataLens run of reproduce.py's valid command but with thresh 0.2."""
    options = paper_rows.ReproduceOptions(
        dataset="fashion_mnist", eps=1, teachers=4, max_records=80, num_samples=60,
        epochs=1, seed=3, teacher_chunk=4, data_dir=names["data"], thresh=0.2)
    config = paper_rows.build_config(options)[0]
    _saved_run(f"{names['tmp']}/run", {"config": config.to_dict()})


def write_file(relative: str, text: str) -> Callable[[dict[str, str]], None]:
    """Writes ``text`` to ``{tmp}/<relative>`` (folders made)."""
    def prepare(names: dict[str, str]) -> None:
        path = pathlib.Path(names["tmp"]) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return prepare


def bench_report(names: dict[str, str]) -> None:
    """A scripts/bench.py report that Table 6 can read."""
    result = {"config": "fmnist-eps1-4000", "aggregation": "topk_stochastic_sign",
              "measured": {"num_teachers": 200, "cpu_share_of_machine": 0.6},
              "extrapolated": {"num_teachers": 4000, "seconds_per_step": 60.0,
                               "phases_seconds": {"voting": 1.0, "noise": 0.5}}}
    machine = {"cpu_model": "test CPU", "cpus": 2, "tensorflow": "x", "onednn_enabled": True}
    write_file("bench.json", json.dumps({"machine": machine, "results": [result]}))(names)


# ------------------------------------------------------------------ the matrix

@dataclasses.dataclass(frozen=True)
class Bad:
    tool: str                                   # a key of TOOLS
    name: str
    flags: tuple[str, ...]
    message: str
    prepare: Callable[[dict[str, str]], None] | None = None


_NOT_WRITABLE = ("{tool}.py: error: {flag} '/proc/dclens-x' is not writable (cannot create "
                 "a file in '/proc': No such file or directory); choose a writable directory")
_TRUNCATED = ("{tool}.py: error: {{tmp}}/data/fashion_mnist/train-images-idx3-ubyte.gz is "
              "truncated: header says shape (60, 28, 28) (47040 bytes) but only 984 data "
              "bytes follow; download it again")

MATRIX = [
    # ---------------------------------------------------------------- evaluate.py
    Bad("evaluate", "--out not writable", (SAMPLES, "--out", "/proc/dclens-x"),
        _NOT_WRITABLE.format(tool="evaluate", flag="--out")),
    Bad("evaluate", "--out is a file", (SAMPLES, "--out", SAMPLES),
        "evaluate.py: error: --out '{tmp}/samples/samples.npz' exists and is not a "
        "directory; choose another path"),
    Bad("evaluate", "--name with a folder in it", (SAMPLES, "--name", "a/b"),
        "evaluate.py: error: --name 'a/b' must be a file name stem without '/' (the outputs "
        "are <out>/<name>.json and <out>/<name>.png); e.g. --name evaluation-2, and --out "
        "for another folder"),
    Bad("evaluate", "damaged config.json beside the samples", (SAMPLES,),
        "evaluate.py: error: {tmp}/samples/config.json cannot be read (Expecting value: line "
        "1 column 22 (char 21)); it should be the settings of the run that wrote the "
        "samples: restore it, or evaluate a copy of the samples in a folder without it "
        "(with --dataset and --data_dir)",
        write_file("samples/config.json", '{"config": {"train": ')),
    Bad("evaluate", "input folder without samples", ("{data}/fashion_mnist",),
        "evaluate.py: error: {data}/fashion_mnist holds neither samples.npz nor authors' "
        "pickles (*.data-0.pkl); pass the samples file itself"),
    Bad("evaluate", "learning rate nan", (SAMPLES, "--learning_rate", "nan"),
        "evaluate.py: error: learning_rate must be a finite number > 0, got nan"),
    Bad("evaluate", "--range without --protocol authors", (SAMPLES, "--range", "2"),
        "evaluate.py: error: --range and --authors_epochs need --protocol authors"),
    # Refused before the val and sen classifiers train (minutes), not after them.
    Bad("evaluate", "--range reads more samples than are given",
        (SAMPLES, "--protocol", "authors", "--range", "1"),
        "evaluate.py: error: --range 1 reads 10000 samples (the authors' 10000 per pickle) "
        "but only 30 are given; give at least 10000 samples (one pickle), or drop --protocol "
        "authors"),
    # ---------------------------------------------------------------- privacy.py
    Bad("privacy", "sigma nan", ("--sigma", "nan", "--steps", "43"),
        "privacy.py: error: sigma must be a finite number > 0, got nan; it is the std of the "
        "Gaussian noise per vote coordinate; 0 gives no privacy."),
    Bad("privacy", "no query per step", ("--sigma", "5000", "--steps", "43",
                                         "--queries_per_step", "0"),
        "privacy.py: error: --queries_per_step must be an integer >= 1, got 0; it is the "
        "number of TopAgg calls per generator step (the fake batch size, e.g. 30)."),
    Bad("privacy", "delta 1", ("--sigma", "5000", "--steps", "43", "--delta", "1"),
        "privacy.py: error: delta must be a number in the open interval (0, 1), got 1.0; use "
        "a delta well below 1/(number of training records), e.g. 1e-5."),
    Bad("privacy", "max_eps inf", ("--sigma", "5000", "--max_eps", "inf"),
        "privacy.py: error: max_eps must be a finite number > 0, got inf; it is the epsilon "
        "budget."),
    Bad("privacy", "--target_eps with --sigma", ("--target_eps", "1", "--steps", "43",
                                                 "--sigma", "5000"),
        "privacy.py: error: --sigma 5000.0 cannot be combined with --target_eps, which "
        "computes sigma; drop one of them."),
    Bad("privacy gswgan", "no discriminators", ("--sigma", "1.07", "--num_discriminators", "0"),
        "privacy.py gswgan: error: num_discriminators = 0: must be an integer >= 1"),
    Bad("privacy gswgan", "batch size 0", ("--sigma", "1.07", "--batch_size", "0"),
        "privacy.py gswgan: error: batch_size = 0: must be an integer >= 1"),
    Bad("privacy gswgan", "no iteration", ("--sigma", "1.07", "--iterations", "0"),
        "privacy.py gswgan: error: iterations = 0: must be an integer >= 1"),
    Bad("privacy gswgan", "sigma 0", ("--sigma", "0"),
        "privacy.py gswgan: error: sigma = 0.0: must be a finite number > 0"),
    # ---------------------------------------------------------------- dpsgd.py
    Bad("dpsgd", "sigma nan", ("--sigma", "nan"),
        "dpsgd.py: error: sigma = nan: must be a finite number > 0"),
    Bad("dpsgd", "topk above 1", ("--method", "topagg", "--topk", "1.5"),
        "dpsgd.py: error: topk = 1.5: is a fraction of the squared norm (or of the "
        "coordinates): (0, 1]"),
    Bad("dpsgd", "decreasing learning-rate milestones", ("--lr_milestones", "0.8", "0.5"),
        "dpsgd.py: error: lr_milestones = (0.8, 0.5): must be increasing fractions of the "
        "planned steps in (0, 1), e.g. 0.5 0.75"),
    Bad("dpsgd", "validation takes every record", ("--validation", "200"),
        "dpsgd.py: error: 120 training records minus 200 held out leaves -80 private "
        "examples, fewer than batch_size = 20; lower --validation/--anchors/--batch_size or "
        "raise --max_records"),
    Bad("dpsgd", "run dir of a GS-WGAN run", (),
        "dpsgd.py: error: --run_dir '{out}' holds a GS-WGAN run (scripts/gswgan.py), not a "
        "private classifier run (scripts/dpsgd.py), so it cannot be resumed here; choose a "
        "new --run_dir, or pass --restart to set it aside and start over (nothing was "
        "changed)", gswgan_run),
    Bad("dpsgd", "run dir of a run with other settings", (),
        "dpsgd.py: error: --run_dir '{out}' holds a run with other settings, so it cannot be "
        "resumed: sigma: saved 2.0, now None; target_eps: saved None, now 1.0. Resume with "
        "the saved settings (see {out}/config.json), choose a new --run_dir, or pass "
        "--restart to set the old run aside and start over (nothing was changed)",
        lambda names: dpsgd_run(names, "--sigma", "2")),
    Bad("dpsgd", "truncated IDX", ("--data_dir", "{tmp}/data"),
        _TRUNCATED.format(tool="dpsgd"), damaged_data),
    # ---------------------------------------------------------------- gswgan.py
    Bad("gswgan", "target_eps nan", ("--target_eps", "nan"),
        "gswgan.py: error: target_eps = nan: must be a finite number > 0"),
    Bad("gswgan", "no iteration", ("--iterations", "0"),
        "gswgan.py: error: iterations = 0: must be an integer >= 1"),
    Bad("gswgan", "more discriminators than records", ("--num_discriminators", "500"),
        "gswgan.py: error: num_discriminators = 500 exceeds the 120 training records: every "
        "shard would be empty; use at most 120"),
    Bad("gswgan", "run dir of a private classifier run", (),
        "gswgan.py: error: --run_dir '{out}' holds a private classifier run "
        "(scripts/dpsgd.py), not a GS-WGAN run (scripts/gswgan.py), so it cannot be resumed "
        "here; choose a new --run_dir, or pass --restart to set it aside and start over "
        "(nothing was changed)", dpsgd_run),
    Bad("gswgan", "run dir is a file", ("--run_dir", "{tmp}/notes.txt"),
        "gswgan.py: error: --run_dir '{tmp}/notes.txt' exists and is not a directory; choose "
        "another path", write_file("notes.txt", "not a run")),
    Bad("gswgan", "truncated IDX", ("--data_dir", "{tmp}/data"),
        _TRUNCATED.format(tool="gswgan"), damaged_data),
    # ---------------------------------------------------------------- side_by_side.py
    Bad("side_by_side", "thresh 1", ("--thresh", "1"),
        "side_by_side.py: error: --thresh must be in [0, 1), got 1.0; votes pass at thresh x "
        "teachers, e.g. 0.5"),
    Bad("side_by_side", "sigma inf", ("--sigma", "inf"),
        "side_by_side.py: error: --sigma must be a finite number > 0, got inf; it is the std "
        "of the Gaussian noise on the vote sums, e.g. 40"),
    Bad("side_by_side", "max_grad 0", ("--max_grad", "0"),
        "side_by_side.py: error: --max_grad must be a finite number > 0, got 0.0; it is the "
        "gradient clip bound (the paper uses 1e-5)"),
    Bad("side_by_side", "negative pretrain_teacher", ("--pretrain_teacher", "-1"),
        "side_by_side.py: error: --pretrain_teacher must be an integer >= 0, got -1"),
    Bad("side_by_side", "partitions the authors would wrap", ("--teachers", "3", "--records",
                                                              "7"),
        "side_by_side.py: error: teachers x records = 21 must be a multiple of the 10 "
        "classes, so that the authors' class-balanced partitioner gets equal class counts "
        "and cannot wrap around (which would put a record in two partitions); change "
        "--teachers or --records"),
    Bad("side_by_side", "--out not writable", ("--out", "/proc/dclens-x"),
        _NOT_WRITABLE.format(tool="side_by_side", flag="--out")),
    Bad("side_by_side", "--out is a folder", ("--out", "{tmp}"),
        "side_by_side.py: error: --out '{tmp}' is a directory; give the file to write, e.g. "
        "{tmp}/side_by_side.json"),
    Bad("side_by_side", "authors' repository missing", (),
        "side_by_side.py: error: the authors' DataLens repository was not found at "
        "'{tmp}/authors-datalens'; pass --authors_repo PATH (a checkout of "
        "AI-secure/DataLens, e.g. ../shared/authors-datalens)"),
    # ---------------------------------------------------------------- reproduce.py
    Bad("reproduce", "--out not writable", ("--out", "/proc/dclens-x"),
        _NOT_WRITABLE.format(tool="reproduce", flag="--out")),
    Bad("reproduce", "--out is a file", ("--out", "{tmp}/notes.txt"),
        "reproduce.py: error: --out '{tmp}/notes.txt' exists and is not a directory; choose "
        "another path", write_file("notes.txt", "not a folder")),
    Bad("reproduce", "--range without --protocol authors", ("--range", "2"),
        "reproduce.py: error: --range and --authors_epochs need --protocol authors"),
    Bad("reproduce", "--range 0", ("--protocol", "authors", "--range", "0"),
        "reproduce.py: error: range must be an integer >= 1, got 0"),
    Bad("reproduce", "--run_dir not writable", ("--run_dir", "/proc/dclens-x"),
        _NOT_WRITABLE.format(tool="reproduce", flag="--run_dir")),
    Bad("reproduce", "run dir of a GS-WGAN run", (),
        "reproduce.py: error: --run_dir '{tmp}/run' holds a GS-WGAN run (scripts/gswgan.py), "
        "not a DataLens run (scripts/main.py, reproduce.py or tables.py), so it cannot be "
        "resumed here; choose a new --run_dir (nothing was changed)",
        lambda names: gswgan_run(names, "{tmp}/run")),
    Bad("reproduce", "run dir of a run with other settings", (),
        "reproduce.py: error: --run_dir '{tmp}/run' holds a run with other settings, so it "
        "cannot be resumed: topagg.thresh (privacy-relevant): saved 0.2, now 0.9. Resume "
        "with the saved settings (see {tmp}/run/config.json) or choose a new --run_dir "
        "(nothing was changed)",
        datalens_run_with_beta_02),
    Bad("reproduce", "sigma_scale nan", ("--sigma_scale", "nan"),
        "reproduce.py: error: sigma_scale must be in (0, 1] (a fraction of the paper's "
        "sigma), got nan"),
    # ---------------------------------------------------------------- tables.py
    Bad("tables", "--out not writable", ("--out", "/proc/dclens-x"),
        _NOT_WRITABLE.format(tool="tables", flag="--out")),
    Bad("tables", "--out is a file", ("--out", "{tmp}/notes.txt"),
        "tables.py: error: --out '{tmp}/notes.txt' exists and is not a directory; choose "
        "another path", write_file("notes.txt", "not a folder")),
    Bad("tables", "checkpoint interval 0", ("--checkpoint_every", "0"),
        "tables.py: error: --checkpoint_every must be >= 1 (generator steps between "
        "checkpoints), got 0"),
    Bad("tables", "negative teachers", ("--teachers", "-3"),
        "tables.py: error: teachers must be an integer >= 1, got -3"),
    Bad("tables", "matched noise at the paper's scale", ("--teachers", "4000",
                                                         "--matched_noise"),
        "tables.py: error: matched noise is for a reduced scale; these options run 4000 "
        "teachers (the paper's 4000): give --teachers N < 4000 or --scale below 1"),
    Bad("tables 6", "truncated bench report", (),
        "tables.py: error: cannot read the bench report '{tmp}/bench.json': Expecting value: "
        "line 1 column 27 (char 26); write one with scripts/bench.py --out",
        write_file("bench.json", '{"machine": {"cpu_model": ')),
    Bad("tables 6", "negative teachers", ("--teachers", "-5"),
        "tables.py: error: teachers must be an integer >= 1, got -5", bench_report),
    # ---------------------------------------------------------------- tune_classifier.py
    Bad("tune_classifier", "a run not trained on the tuning split", ("{tmp}/private",),
        "tune_classifier.py: error: '{tmp}/private' trained on training_records 'private', "
        "not 'tuning': the classifier's schedule may be chosen only on screening runs "
        "(trained on the tuning split, scored on its holdout), never on a run whose scores "
        "read private records or the test set"),
    Bad("tune_classifier", "a run folder without samples", ("{tmp}/absent",),
        "tune_classifier.py: error: '{tmp}/absent' has no samples.npz: give run directories "
        "of finished screening runs (scripts/tables.py --training_records tuning)"),
    Bad("tune_classifier", "learning rate 0", ("--learning_rates", "1e-3", "0"),
        "tune_classifier.py: error: --learning_rates must be finite numbers > 0, got 0.0"),
    Bad("tune_classifier", "a repeated learning rate", ("--learning_rates", "1e-3", "0.001"),
        "tune_classifier.py: error: learning rates repeat: [0.001, 0.001]"),
    Bad("tune_classifier", "0 epochs", ("--epochs", "0"),
        "tune_classifier.py: error: --epochs must be >= 1, got 0"),
    Bad("tune_classifier", "--out is a file", ("--out", "{tmp}/screen/samples.npz"),
        "tune_classifier.py: error: --out '{tmp}/screen/samples.npz' exists and is not a "
        "directory; choose another path"),
    Bad("tune_classifier", "--out holds someone else's README.md", ("--out", "{tmp}/docs"),
        "tune_classifier.py: error: '{tmp}/docs/README.md' exists and was not written by a "
        "classifier choice (no summary.json beside it); give an empty or new --out folder",
        write_file("docs/README.md", "# my notes\n")),
    # ---------------------------------------------------------------- table1.py
    Bad("table1", "--results is a file", ("--results", "{tmp}/results/fmnist-eps1/report.json"),
        "table1.py: error: --results '{tmp}/results/fmnist-eps1/report.json' is not a "
        "folder; pass the folder that holds the reproduction reports "
        "(results/<name>/report.json)"),
    Bad("table1", "truncated report", (),
        "table1.py: error: {tmp}/results/cut/report.json is not a readable reproduction "
        "report (Expecting value: line 1 column 18 (char 17)); restore it from the run that "
        "wrote it (scripts/reproduce.py), or move its folder out of --results",
        write_file("results/cut/report.json", '{"paper_config": ')),
    Bad("table1", "report without its evaluation", (),
        "table1.py: error: {tmp}/results/bare/report.json is not a readable reproduction "
        "report (no 'evaluation'); restore it from the run that wrote it "
        "(scripts/reproduce.py), or move its folder out of --results",
        write_file("results/bare/report.json", '{"paper_config": true}')),
    Bad("table1", "--markdown in a missing folder", ("--markdown", "/proc/dclens-x/README.md"),
        "table1.py: error: --markdown '/proc/dclens-x/README.md': its folder '/proc/dclens-x' "
        "does not exist; create it or choose another file"),
    Bad("table1", "--markdown is a folder", ("--markdown", "{tmp}/site"),
        "table1.py: error: --markdown '{tmp}/site' is a directory; give the markdown file to "
        "write, e.g. {tmp}/site/README.md"),
    Bad("table1", "--markdown with one marker", (),
        "table1.py: error: {out} has only one of the markers; restore both "
        "('<!-- table1:begin (written by scripts/table1.py; edit outside the markers) -->' "
        "and '<!-- table1:end -->') or remove the one left",
        write_file("site/README.md", "# Results\n<!-- table1:end -->\n")),
]


@pytest.mark.parametrize("saved", [{"config": {"train": {}, "topagg": {}, "budget": {}}},
                                   {"config": {}, "kind": "DataLens"}],
                         ids=["DataLens run without a kind", "DataLens run with its kind"])
def test_a_run_of_the_tools_own_kind_is_left_to_its_resume_check(saved, tmp_path):
    """Only another tool's run is refused by kind; the tool's own (with or without the
    ``kind`` its config.json records) goes on to the trainer's settings comparison."""
    _saved_run(str(tmp_path / "run"), saved)
    assert output_checks.run_kind(str(tmp_path / "run")) == "datalens"
    output_checks.check_run_kind(str(tmp_path / "run"), "datalens", restart=False)
    with pytest.raises(output_checks.RunDirError, match="holds a DataLens run"):
        output_checks.check_run_kind(str(tmp_path / "run"), "gswgan")


def test_every_tool_has_its_rows():
    modules = {tool.module for tool in TOOLS.values()}
    rows = {module: sum(TOOLS[bad.tool].module == module for bad in MATRIX)
            for module in modules}
    assert min(rows.values()) >= 5, rows
    assert len({(bad.tool, bad.name) for bad in MATRIX}) == len(MATRIX)


@pytest.mark.parametrize("bad", MATRIX, ids=[f"{bad.tool}: {bad.name}" for bad in MATRIX])
def test_bad_input_gets_its_error_and_writes_nothing(bad, tmp_path, tiny_fmnist_dir):
    tool = TOOLS[bad.tool]
    names = {"tmp": str(tmp_path), "data": str(tiny_fmnist_dir),
             "out": str(tmp_path / tool.out)}
    if tool.setup is not None:
        tool.setup(tmp_path)
    if bad.prepare is not None:
        bad.prepare(names)
    outputs = [pathlib.Path(path.format(**names)) for path in tool.outputs]
    absent = [path for path in outputs if not path.exists()]
    before = snapshot(tmp_path)
    argv = [flag.format(**names) for flag in (*tool.valid, *bad.flags)]
    code, err = run_tool(tool.module, argv)
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == bad.message.format(**names)
    assert code == USAGE
    assert snapshot(tmp_path) == before
    assert [path for path in absent if path.exists()] == []


def test_ctrl_c_in_reproduce_says_how_to_resume_in_one_line(tmp_path, tiny_fmnist_dir,
                                                            monkeypatch):
    """It used to end in a traceback from inside the teacher kernel (found on a
    paper-scale run stopped after its checkpoint). During training it names the run's
    ledger and checkpoint as scripts/main.py does; elsewhere, the command that goes on."""
    from dclens.experiments import reproduce as experiment

    tool = TOOLS["reproduce"]
    names = {"tmp": str(tmp_path), "data": str(tiny_fmnist_dir),
             "out": str(tmp_path / tool.out)}
    argv = [flag.format(**names) for flag in tool.valid]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(experiment, "reproduce", interrupted)
    code, err = run_tool("reproduce", argv)
    assert code == 130 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("reproduce.py: interrupted before the first step; kept: ")
    assert lines[0].endswith("resume with: python scripts/reproduce.py " + " ".join(argv))
    monkeypatch.setattr(experiment, "add_quality", interrupted)
    code, err = run_tool("reproduce", [*argv, "--add_quality"])
    assert code == 130
    assert err.strip() == ("reproduce.py: interrupted; what was finished is kept and the "
                           "same command goes on from it: python scripts/reproduce.py "
                           + " ".join([*argv, "--add_quality"]))
