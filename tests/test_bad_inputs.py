"""The bad-input matrix: every bad input gets its exact error, and nothing is written.

Each row: the flags (added to a small valid command), how the data / run directory is
prepared, the exact last line printed on stderr (``{data}``, ``{out}`` are substituted) and
the exit status.  After the call the run directory and the data are byte-for-byte what they
were before (or the run directory still does not exist).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import pathlib

import numpy as np
import pytest

from conftest import load_script, run_tool, snapshot, write_idx

cli = load_script("main")

VALID = ["--train", "--dataset", "fashion_mnist", "--batch_teachers", "4", "--batch_size", "5",
         "--topk", "20", "--sigma", "20", "--thresh", "0.25", "--max_eps", "50",
         "--z_dim", "8", "--pretrain_teacher", "1", "--num_samples", "20", "--seed", "1",
         "--conversion", "classic", "--quiet"]
USAGE = 2          # argparse / configuration errors
RUN_ERROR = 2      # errors found when the data or the run directory is looked at
DIVERGED = 3


def make_data(root: pathlib.Path, *, images: int = 20, labels: int = 20, size: int = 28,
              damage: str | None = None) -> pathlib.Path:
    folder = root / "fashion_mnist"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split in ("train", "t10k"):
        write_idx(folder / f"{split}-images-idx3-ubyte.gz",
                  rng.integers(0, 255, size=(images, size, size)))
        write_idx(folder / f"{split}-labels-idx1-ubyte.gz", np.arange(labels) % 10)
    path = folder / "train-images-idx3-ubyte.gz"
    if damage == "magic":
        with gzip.open(path, "wb") as stream:
            stream.write(b"\x01\x02\x03\x04" + bytes(100))
    elif damage == "truncated":
        raw = gzip.open(path).read()
        with gzip.open(path, "wb") as stream:
            stream.write(raw[:1000])
    return root


def foreign_run_dir(out: pathlib.Path) -> None:
    out.mkdir()
    (out / "model.ckpt-100.index").write_text("an authors' TF1 checkpoint")


def gswgan_run_dir(out: pathlib.Path) -> None:
    """A GS-WGAN run directory (its config.json names its kind)."""
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"config": {"iterations": 5},
                                                 "kind": "gswgan"}))


def other_run_dir(out: pathlib.Path) -> None:
    """A dclens run directory whose run used sigma 30 and 2 teachers."""
    _, other, _, _ = cli.resolve(cli.build_parser().parse_args(
        [*VALID, "--sigma", "30", "--batch_teachers", "2"]))
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"config": other.to_dict()}))


@dataclasses.dataclass(frozen=True)
class Bad:
    name: str
    flags: tuple[str, ...]
    message: str
    code: int = USAGE
    data: dict | None = None        # make_data kwargs; None = no data directory at all
    run_dir: object = None          # prepares the run directory


MATRIX = [
    Bad("topk <= 0", ("--topk", "0"), "main.py: error: topk must be an integer >= 1, got 0"),
    Bad("topk > image dimension", ("--topk", "785"),
        "main.py: error: topk=785 is larger than the image dimension 784 of fashion_mnist; "
        "use topk <= 784", RUN_ERROR, data={}),
    Bad("sigma = 0 without --non_private", ("--sigma", "0"),
        "main.py: error: sigma must be > 0 for a private run, got 0.0; pass --non_private to "
        "debug without noise (its output is not private)"),
    Bad("sigma < 0", ("--sigma", "-2"),
        "main.py: error: sigma must be a finite number >= 0, got -2.0"),
    Bad("thresh = 1", ("--thresh", "1"), "main.py: error: thresh must be in [0, 1), got 1.0"),
    Bad("thresh < 0", ("--thresh", "-0.5"),
        "main.py: error: thresh must be in [0, 1), got -0.5"),
    Bad("max_eps = 0", ("--max_eps", "0"),
        "main.py: error: max_eps must be a finite number > 0, got 0.0"),
    Bad("max_eps < 0", ("--max_eps", "-1"),
        "main.py: error: max_eps must be a finite number > 0, got -1.0"),
    Bad("delta = 0", ("--delta", "0"), "main.py: error: delta must be in (0, 1), got 0.0"),
    Bad("delta = 1", ("--delta", "1"), "main.py: error: delta must be in (0, 1), got 1.0"),
    Bad("more teachers than records", ("--batch_teachers", "30"),
        "main.py: error: more teachers (30) than records (20): each partition would be empty; "
        "use at most 20 teachers", RUN_ERROR, data={}),
    Bad("partition smaller than 1", ("--max_records", "3"),
        "main.py: error: more teachers (4) than records (3): each partition would be empty; "
        "use at most 3 teachers", RUN_ERROR, data={}),
    Bad("no teachers", ("--batch_teachers", "0"),
        "main.py: error: --batch_teachers and --teachers_batch must be >= 1, got 0 and 1"),
    Bad("unknown dataset", ("--dataset", "cifar10"),
        "main.py: error: unknown dataset name 'cifar10'; valid names are: mnist, "
        "fashion_mnist, celebA-gender-train, celebA-gender-val, celebA-gender-test, "
        "celebA-gender-all, celebA-hair-train, celebA-hair-val, celebA-hair-test, "
        "celebA-hair-all"),
    Bad("corrupt IDX", (), "main.py: error: {data}/fashion_mnist/train-images-idx3-ubyte.gz "
        "is not an IDX file: bad magic '01020304' (expected 0000 followed by type and ndim "
        "bytes)", RUN_ERROR, data={"damage": "magic"}),
    Bad("truncated IDX", (), "main.py: error: {data}/fashion_mnist/train-images-idx3-ubyte.gz "
        "is truncated: header says shape (20, 28, 28) (15680 bytes) but only 984 data bytes "
        "follow; download it again", RUN_ERROR, data={"damage": "truncated"}),
    Bad("image/label count mismatch", (), "main.py: error: 20 images but labels have shape "
        "(19,) ({data}/fashion_mnist/train-images-idx3-ubyte.gz + "
        "{data}/fashion_mnist/train-labels-idx1-ubyte.gz); the files do not belong together",
        RUN_ERROR, data={"labels": 19}),
    Bad("wrong image size", (), "main.py: error: fashion_mnist images have shape (20, 32, 32), "
        "expected [N, 28, 28] ({data}/fashion_mnist/train-images-idx3-ubyte.gz + "
        "{data}/fashion_mnist/train-labels-idx1-ubyte.gz); wrong file?",
        RUN_ERROR, data={"size": 32}),
    Bad("checkpoint dir inside a file", ("--checkpoint_dir", "{data}/fashion_mnist/"
                                         "train-labels-idx1-ubyte.gz/run"),
        "main.py: error: --checkpoint_dir '{data}/fashion_mnist/train-labels-idx1-ubyte.gz/run'"
        " cannot be created: '{data}/fashion_mnist/train-labels-idx1-ubyte.gz' is a file, not "
        "a directory; choose another path", RUN_ERROR, data={}),
    Bad("non-writable checkpoint dir", ("--checkpoint_dir", "/proc/dclens-run"),
        "main.py: error: --checkpoint_dir '/proc/dclens-run' is not writable (cannot create a "
        "file in '/proc': No such file or directory); choose a writable directory",
        RUN_ERROR, data={}),
    Bad("checkpoint dir of a different run", (),
        "main.py: error: --checkpoint_dir '{out}' holds a run with other settings, so it "
        "cannot be resumed: topagg.sigma (privacy-relevant): saved 30.0, now 20.0; "
        "train.data_dir (privacy-relevant): saved None, now '{data}'; "
        "train.num_teachers (privacy-relevant): saved 2, now 4. Resume with the saved "
        "settings (see {out}/config.json), choose a new --checkpoint_dir, or pass --restart "
        "to set the old run aside and start over (nothing was changed)",
        RUN_ERROR, data={}, run_dir=other_run_dir),
    Bad("checkpoint dir of another tool's run", (),
        "main.py: error: --checkpoint_dir '{out}' holds a GS-WGAN run (scripts/gswgan.py), "
        "not a DataLens run (scripts/main.py, reproduce.py or tables.py), so it cannot be "
        "resumed here; choose a new --checkpoint_dir, or pass --restart to set it aside and "
        "start over (nothing was changed)", RUN_ERROR, data={}, run_dir=gswgan_run_dir),
    Bad("checkpoint dir of something else", (),
        "main.py: error: --checkpoint_dir '{out}' is not empty and is not a dclens run (it "
        "holds model.ckpt-100.index); choose a new or empty directory, or pass --restart to "
        "move it aside (nothing was changed)", RUN_ERROR, data={}, run_dir=foreign_run_dir),
    Bad("z_dim <= 0", ("--z_dim", "0"), "main.py: error: z_dim must be an integer >= 1, got 0"),
    Bad("learning rate = 0", ("--learning_rate", "0"),
        "main.py: error: learning_rate must be a finite number > 0, got 0.0"),
    Bad("learning rate < 0", ("--learning_rate", "-0.1"),
        "main.py: error: learning_rate must be a finite number > 0, got -0.1"),
    Bad("checkpoint interval 0", ("--checkpoint_every", "0"),
        "main.py: error: --checkpoint_every must be >= 1, got 0"),
    Bad("unknown flag", ("--frobnicate",), "main.py: error: unrecognized arguments: --frobnicate"),
    Bad("authors' flag not supported yet", ("--wgan",),
        "main.py: error: --wgan (a flag of the authors' main.py) is not implemented in dclens "
        "yet: only the standard GAN loss is implemented"),
    Bad("authors' flag not supported yet (--mean_kernel)", ("--mean_kernel",),
        "main.py: error: --mean_kernel (a flag of the authors' main.py) is not implemented in "
        "dclens yet: mean-kernel aggregation is not implemented; --aggregation lists the "
        "implemented ones"),
]


def run_cli(argv: list[str]) -> tuple[int, str]:
    """main.py's exit status and stderr."""
    return run_tool("main", argv)


def test_the_matrix_has_at_least_20_rows():
    assert len(MATRIX) >= 20 and len({bad.name for bad in MATRIX}) == len(MATRIX)


@pytest.mark.parametrize("bad", MATRIX, ids=[bad.name for bad in MATRIX])
def test_bad_input_gets_its_error_and_writes_nothing(bad, tmp_path):
    data = (make_data(tmp_path / "data", **bad.data) if bad.data is not None
            else tmp_path / "no-data")
    out = tmp_path / "run"
    if bad.run_dir is not None:
        bad.run_dir(out)
    names = {"data": str(data), "out": str(out)}
    flags = [flag.format(**names) for flag in bad.flags]
    before = snapshot(tmp_path)
    code, err = run_cli([*VALID, "--data_dir", str(data), "--checkpoint_dir", str(out), *flags])
    assert err.strip().splitlines()[-1] == bad.message.format(**names)
    assert code == bad.code
    assert snapshot(tmp_path) == before
    if bad.run_dir is None:
        assert not out.exists()


def _poison_step_one(monkeypatch, **fields) -> None:
    """Makes DataLens' step 1 report ``fields`` (e.g. a non-finite loss)."""
    from dclens.datalens.train import DataLens

    original = DataLens.train_step

    def poisoned(self):
        record = original(self)
        return dataclasses.replace(record, **fields) if record.step == 1 else record

    monkeypatch.setattr(DataLens, "train_step", poisoned)


def test_a_non_finite_teacher_loss_neither_stops_the_run_nor_reaches_its_outputs(
        tiny_fmnist_dir, tmp_path, monkeypatch, capsys):
    """The teachers' loss is a noise-free function of the private records: whether it is
    finite must not decide when the run stops, nor reach privacy.json or the terminal
    (it used to stop the run with stop_reason 'non-finite loss')."""
    _poison_step_one(monkeypatch, teacher_loss=math.nan)
    out = tmp_path / "run"
    code, err = run_cli([*VALID, "--data_dir", str(tiny_fmnist_dir), "--checkpoint_dir",
                         str(out)])
    assert code == 0, err
    privacy = json.loads((out / "privacy.json").read_text())
    assert "non-finite" not in privacy["stop_reason"]
    assert (out / "samples.npz").exists()
    assert "not finite" not in err and "diverged" not in err


def test_non_finite_loss_stops_keeping_ledger_and_last_checkpoint(tiny_fmnist_dir, tmp_path,
                                                                  monkeypatch):
    """NaN in the student's loss: exit 3, the message says so; ledger and last good
    checkpoint kept."""
    _poison_step_one(monkeypatch, student_loss=math.inf)
    out = tmp_path / "run"
    code, err = run_cli([*VALID, "--data_dir", str(tiny_fmnist_dir), "--checkpoint_dir",
                         str(out), "--checkpoint_every", "1"])
    assert code == DIVERGED
    assert "main.py: training diverged: step 2: the student's loss is not finite (inf)" in err
    assert f"the last good checkpoint is {out}/checkpoints/ckpt-000001" in err
    assert sorted(os.listdir(out / "checkpoints")) == ["PRIVATE", "ckpt-000001", "seed.json"]
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger["queries"] == 2 * 5                     # both steps' queries are counted
    assert not (out / "samples.npz").exists()
    # A second run of the same command resumes from the good checkpoint (and diverges
    # again at the same step): the ledger only grows.
    code, _ = run_cli([*VALID, "--data_dir", str(tiny_fmnist_dir), "--checkpoint_dir",
                       str(out), "--checkpoint_every", "1"])
    assert code == DIVERGED
    assert json.loads((out / "ledger.json").read_text())["queries"] == 3 * 5


def test_a_budget_that_allows_no_step_is_refused_before_anything_is_written(
        tiny_fmnist_dir, tmp_path):
    """It used to exit 0 and write an untrained generator's noise as the run's samples."""
    out = tmp_path / "run"
    flags = [*VALID]
    flags[flags.index("--max_eps") + 1] = "0.01"
    code, err = run_cli([*flags, "--data_dir", str(tiny_fmnist_dir), "--checkpoint_dir",
                         str(out)])
    assert code == RUN_ERROR, err
    assert "allows 0 generator steps: one step (1 round(s) of 5 TopAgg queries) costs " \
           "epsilon = " in err
    assert "raise --max_eps to at least" in err
    assert not out.exists()


def test_the_budget_line_does_not_pass_the_epoch_cap_off_as_the_budget(tiny_fmnist_dir,
                                                                        tmp_path):
    from dclens.datalens import run as run_lib

    lines = []
    flags = [*VALID]
    flags[flags.index("--max_eps") + 1] = "5000"
    config = cli.resolve(cli.build_parser().parse_args(
        [*flags, "--data_dir", str(tiny_fmnist_dir), "--epoch", "1"]))[1]
    run_lib.train_run(config, str(tmp_path / "run"), progress=False, log=lines.append)
    budget = [line for line in lines if line.startswith("the budget epsilon <= 5000 allows")]
    assert len(budget) == 1, lines
    allowed = int(budget[0].split(" allows ")[1].split()[0])
    assert allowed > 2 and "the epoch cap (--epoch 1) ends the run at step" in budget[0]


def _main_with_step_2_starting_by(action, data_dir, out, monkeypatch, *,
                                  checkpoint_every: int) -> tuple[list[str], int, str]:
    """main.py on the VALID run with ``action()`` called as step 2 starts (before its
    spend); returns (argv, exit status, stderr), with the step restored after."""
    from dclens.datalens.train import DataLens

    original = DataLens.train_step

    def starting_by_action(self):
        if self.step == 2:
            action()
        return original(self)

    monkeypatch.setattr(DataLens, "train_step", starting_by_action)
    argv = [*VALID, "--data_dir", str(data_dir), "--checkpoint_dir", str(out),
            "--checkpoint_every", str(checkpoint_every)]
    code, err = run_cli(argv)
    monkeypatch.setattr(DataLens, "train_step", original)
    return argv, code, err


def test_ctrl_c_prints_one_line_that_says_how_to_resume_and_exits_130(tiny_fmnist_dir,
                                                                     tmp_path, monkeypatch):
    """It used to end in a 52-line TensorFlow traceback."""
    def interrupt() -> None:
        raise KeyboardInterrupt

    argv, code, err = _main_with_step_2_starting_by(interrupt, tiny_fmnist_dir,
                                                    tmp_path / "run", monkeypatch,
                                                    checkpoint_every=1)
    assert code == 130
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("main.py: interrupted at step 2; kept: the privacy ledger (")
    assert "the checkpoint of step 2" in lines[0]
    assert lines[0].endswith("resume with: python scripts/main.py " + " ".join(argv))
    assert run_cli(argv)[0] == 0                          # the command it names resumes


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_during_a_step_pauses_after_it_with_a_checkpoint_and_twice_stops_at_once(
        presses, tiny_fmnist_dir, tmp_path, monkeypatch, ctrl_c_is_python_s):
    """A real SIGINT while step 2 trains (checkpoints only every 10 steps).  Once: the step
    ends, a checkpoint of step 3 is written and nothing is lost.  Twice: the second press
    interrupts step 2 itself, and the spends since the start stay counted as lost."""
    import signal

    def press() -> None:
        for _ in range(presses):
            os.kill(os.getpid(), signal.SIGINT)

    out = tmp_path / "run"
    argv, code, err = _main_with_step_2_starting_by(press, tiny_fmnist_dir, out, monkeypatch,
                                                    checkpoint_every=10)
    assert code == 130 and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    lines = err.strip().splitlines()
    assert lines[0] == ("main.py: SIGINT: stopping after the current step, with a checkpoint, "
                        "so that a resume loses nothing (press Ctrl-C again to stop at once: "
                        "the privacy spent since the last checkpoint then stays counted with "
                        "its steps lost)")
    assert len(lines) == 2, err
    checkpoints = sorted(name for name in os.listdir(out / "checkpoints")
                         if name.startswith("ckpt-"))
    if presses == 1:
        assert lines[1].startswith("main.py: interrupted at step 3; kept: the privacy ledger (")
        assert lines[1].endswith("and the checkpoint of step 3 (nothing to redo); resume "
                                 "with: python scripts/main.py " + " ".join(argv))
        assert checkpoints == ["ckpt-000003"]
    else:
        assert lines[1].startswith("main.py: interrupted at step 2; kept: the privacy ledger (")
        assert "no checkpoint yet" in lines[1] and checkpoints == []
    assert run_cli(argv)[0] == 0
    lost = json.loads((out / "privacy.json").read_text())["lost_spends"]
    assert (lost == []) == (presses == 1), lost
