"""Tests for scripts/main.py: flag validation, flag -> config mapping, a tiny real run."""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import re

import numpy as np
import pytest

from dclens.datalens import config as cfg
from dclens.common import export
from conftest import load_script

cli = load_script("main")

RUN_OUTPUTS = ("config.json", "privacy.json", "generator.keras", "samples.npz", "samples.png")


def resolve(*argv: str):
    return cli.resolve(cli.build_parser().parse_args(list(argv)))


# ------------------------------------------------------------ rejected before anything runs

# (flags, substrings the error message must contain)
BAD_FLAGS = [
    (["--topk", "0"], ["topk", "got 0"]),
    (["--sigma", "-1"], ["sigma", "got -1.0"]),
    (["--sigma", "0"], ["sigma", "got 0.0", "--non_private"]),
    (["--sigma", "nan"], ["sigma", "got nan"]),
    (["--thresh", "1.5"], ["thresh", "got 1.5"]),
    (["--thresh", "-0.1"], ["thresh", "got -0.1"]),
    (["--max_eps", "0"], ["max_eps", "got 0.0"]),
    (["--delta", "0"], ["delta", "got 0.0"]),
    (["--delta", "1.5"], ["delta", "got 1.5"]),
    (["--z_dim", "0"], ["z_dim", "got 0"]),
    (["--learning_rate", "0"], ["learning_rate", "got 0.0"]),
    (["--batch_size", "0"], ["batch_size", "got 0"]),
    (["--d_step", "0"], ["d_step", "got 0"]),
    (["--epoch", "0"], ["epochs", "got 0"]),
    (["--batch_teachers", "0"], ["--batch_teachers", "got 0"]),
    (["--teachers_batch", "-3"], ["--teachers_batch", "-3"]),
    (["--max_grad", "0"], ["--max_grad", "got 0.0"]),
    (["--max_grad=-1e-5"], ["--max_grad", "got -1e-05"]),
    (["--orders", "2"], ["orders", "got 2"]),
    (["--seed", "-1"], ["seed", "got -1"]),
    (["--max_records", "0"], ["max_records", "got 0"]),
    (["--preset", "nope"], ["'nope'", "fashion_mnist-eps1"]),
    (["--conversion", "bogus"], ["--conversion", "'bogus'"]),
    (["--frobnicate", "1"], ["unrecognized arguments", "--frobnicate 1"]),
    (["--wgan"], ["--wgan", "not implemented"]),
    (["--mean_kernel"], ["--mean_kernel", "not implemented"]),
    (["--pca"], ["--pca", "not implemented"]),
    (["--step_size", "1e-4"], ["--step_size", "not implemented"]),
    (["--wgan=true"], ["--wgan", "not implemented"]),
    (["--norandom_proj"], ["--norandom_proj", "G-PATE"]),
    (["--save_epoch"], ["--save_epoch", "not implemented"]),
    (["--crop=false"], ["--crop=false", "not implemented"]),
    (["--pretrain"], ["--pretrain", "not implemented"]),
    (["--nosignsgd"], ["--nosignsgd", "G-PATE"]),
    (["--signsgd=false"], ["--nosignsgd"]),
    (["--train=maybe"], ["--train", "'maybe'"]),
    (["--topk", "ten"], ["--topk", "'ten'"]),
]


@pytest.mark.parametrize("flags,expected", BAD_FLAGS,
                         ids=[" ".join(flags) for flags, _ in BAD_FLAGS])
def test_bad_flag_is_rejected_and_nothing_is_written(flags, expected, tmp_path, capsys):
    out = tmp_path / "out"
    # A dataset that does not exist: were a bad value accepted, the run would fail fast
    # at data loading (return 2, no SystemExit) instead of training for long.
    argv = ["--train", "--dataset", "fashion_mnist", "--data_dir", str(tmp_path / "nodata"),
            "--checkpoint_dir", str(out), "--quiet", *flags]
    with pytest.raises(SystemExit) as excinfo:
        cli.main(argv)
    assert excinfo.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err
    for text in expected:
        assert text in err, (text, err)
    assert not out.exists()


def test_sigma_zero_with_non_private_is_accepted():
    _, config, _, _ = resolve("--sigma", "0", "--non_private")
    assert config.topagg.sigma == 0.0 and config.train.non_private is True


# --------------------------------------------------------- errors found after loading data

def _assert_no_partial_run(out: pathlib.Path) -> None:
    for name in RUN_OUTPUTS:
        assert not (out / name).exists(), name
    # The output directory is created (and probed for writability) before the data is
    # loaded; what must not be left behind is any file of a run.
    if out.exists():
        assert os.listdir(out) == []


def test_topk_larger_than_image_dimension(tiny_fmnist_dir, tmp_path, capsys):
    out = tmp_path / "out"
    code = cli.main(["--train", "--dataset", "fashion_mnist", "--data_dir", str(tiny_fmnist_dir),
                     "--topk", "1000", "--checkpoint_dir", str(out), "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert "topk=1000" in err and "784" in err
    _assert_no_partial_run(out)


def test_more_teachers_than_records(tiny_fmnist_dir, tmp_path, capsys):
    out = tmp_path / "out"
    code = cli.main(["--train", "--dataset", "fashion_mnist", "--data_dir", str(tiny_fmnist_dir),
                     "--batch_teachers", "200", "--teachers_batch", "1",
                     "--checkpoint_dir", str(out), "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert "more teachers (200) than records (120)" in err
    _assert_no_partial_run(out)


def test_missing_data_dir_lists_paths_tried(tmp_path, capsys):
    out = tmp_path / "out"
    nowhere = tmp_path / "nowhere"
    code = cli.main(["--train", "--dataset", "fashion_mnist", "--data_dir", str(nowhere),
                     "--checkpoint_dir", str(out), "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert "could not find 'fashion_mnist'" in err
    assert "Tried:" in err
    assert str(nowhere / "fashion_mnist" / "train-images-idx3-ubyte.gz") in err
    assert str(nowhere / "train-labels-idx1-ubyte") in err
    _assert_no_partial_run(out)


# ------------------------------------------------------------------ flags -> configuration

def test_teacher_count_is_the_product():
    _, config, _, _ = resolve("--batch_teachers", "5", "--teachers_batch", "3")
    assert config.train.num_teachers == 15
    _, config, _, _ = resolve("--batch_teachers", "7")
    assert config.train.num_teachers == 7


def test_signsgd_stochastic_is_the_stochastic_sign():
    _, config, _, _ = resolve("--signsgd", "--stochastic")
    assert config.topagg.method is cfg.Aggregation.TOPK_STOCHASTIC_SIGN
    _, config, _, _ = resolve("--dataset", "fashion_mnist", "--signsgd", "--stochastic")
    assert config.topagg.method is cfg.Aggregation.TOPK_STOCHASTIC_SIGN


def test_signsgd_alone_on_authors_preset_is_deterministic_sign():
    name, config, _, _ = resolve("--dataset", "fashion_mnist", "--signsgd")
    assert name == "authors"
    assert config.topagg.method is cfg.Aggregation.TOPK_SIGN


@pytest.mark.parametrize("argv", [["--nostochastic"], ["--stochastic=false"],
                                  ["--preset", "mnist-eps1", "--nostochastic"]])
def test_nostochastic_is_deterministic_sign(argv):
    _, config, _, _ = resolve(*argv)
    assert config.topagg.method is cfg.Aggregation.TOPK_SIGN


@pytest.mark.parametrize("argv,expected", [(["--shuffle=false"], False), (["--noshuffle"], False),
                                           (["--shuffle"], True), (["--shuffle=0"], False)])
def test_shuffle_is_balanced_partition(argv, expected):
    _, config, _, _ = resolve(*argv)
    assert config.train.balanced_partition is expected


def test_no_flags_is_the_demo():
    name, config, do_train, output = resolve()
    assert name == "demo"
    assert do_train is True
    assert output == "runs/demo"
    assert config == cfg.demo_preset()


def test_dataset_alone_is_the_authors_defaults():
    name, config, do_train, output = resolve("--dataset", "mnist")
    assert name == "authors"
    assert do_train is False
    assert output == "checkpoint"
    assert config.train.dataset == "mnist"
    assert config.topagg.topk == 50
    assert config.topagg.sigma == 2000.0
    assert config.topagg.thresh == 0.5
    assert config.train.d_step == 1
    assert config.train.z_dim == 100
    assert config.train.num_teachers == 1
    assert config.train.batch_size == 30
    assert config.train.epochs == 1000
    assert config.train.pretrain_teacher == 0
    assert config.budget.max_eps == 1.0 and config.budget.delta == 1e-5
    assert config.budget.max_order == 200


def test_paper_preset_by_name():
    name, config, do_train, _ = resolve("--preset", "fashion_mnist-eps1")
    assert name == "fashion_mnist-eps1"
    assert do_train is False
    assert config.train.num_teachers == 4000
    assert config.topagg.topk == 200
    assert config.topagg.sigma == 5000.0
    assert config.topagg.thresh == 0.9
    assert config == cfg.preset("fashion_mnist-eps1")


def test_flags_override_a_preset():
    _, config, _, _ = resolve("--preset", "fashion_mnist-eps1", "--sigma", "10")
    base = cfg.preset("fashion_mnist-eps1")
    assert config.topagg.sigma == 10.0
    assert config == base.replace(topagg={"sigma": 10.0})
    _, config, do_train, output = resolve("--preset", "fashion_mnist-eps1", "--train",
                                          "--max_eps", "3", "--checkpoint_dir", "x")
    assert do_train is True and output == "x"
    assert config.budget.max_eps == 3.0
    assert config.topagg == base.topagg


def test_conversion_and_orders_map_to_budget():
    _, config, _, _ = resolve("--conversion", "dp_accounting", "--orders", "64")
    assert config.budget.conversion is cfg.Conversion.DP_ACCOUNTING
    assert config.budget.max_order == 64


# ------------------------------------------------------------------------ a tiny real run

@pytest.fixture(scope="module")
def cli_run(tiny_fmnist_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    code = cli.main(["--dataset", "fashion_mnist", "--data_dir", str(tiny_fmnist_dir), "--train",
                     "--signsgd", "--stochastic", "--batch_teachers", "2", "--teachers_batch", "2",
                     "--batch_size", "10", "--topk", "50", "--sigma", "20", "--thresh", "0.25",
                     "--max_eps", "1000", "--epoch", "1", "--d_step", "1",
                     "--pretrain_teacher", "1", "--z_dim", "8", "--num_samples", "20",
                     "--seed", "1", "--max_records", "80", "--checkpoint_dir", str(out),
                     "--quiet"])
    return code, out


def test_tiny_cli_run_writes_a_run(cli_run):
    code, out = cli_run
    assert code == 0
    for name in RUN_OUTPUTS:
        assert (out / name).exists(), name
    saved = json.loads((out / "config.json").read_text())
    assert saved["config"]["train"]["num_teachers"] == 4
    assert saved["config"]["topagg"]["method"] == "topk_stochastic_sign"
    assert saved["config"]["topagg"]["topk"] == 50
    assert saved["config"]["train"]["max_records"] == 80
    assert saved["records"] == 80
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["stop_reason"] == "epochs"
    assert 0 < privacy["epsilon"]["epsilon"] <= 1000
    assert np.load(out / "samples.npz")["x"].shape == (20, 28, 28, 1)


def test_sampling_mode_writes_a_new_sample_set(cli_run, capsys):
    code, out = cli_run
    assert code == 0
    before = np.load(out / "samples.npz")["x"]
    config_before = (out / "config.json").read_text()
    pickle_names = sorted((p.name for p in out.glob("*.data-*.pkl")),
                          key=lambda n: int(n.rsplit("-", 1)[1][:-4]))
    assert len(pickle_names) == 10
    code = cli.main(["--checkpoint_dir", str(out), "--dataset", "fashion_mnist",
                     "--num_samples", "10", "--seed", "2"])
    assert code == 0
    np.testing.assert_array_equal(np.load(out / "samples.npz")["x"], before)  # kept
    new_set = out / "samples-2"
    samples = np.load(new_set / "samples.npz")
    assert samples["x"].shape == (10, 28, 28, 1)
    assert samples["y"].shape == (10,)
    assert 0.0 <= samples["x"].min() and samples["x"].max() <= 1.0
    assert not np.array_equal(samples["x"], before[:10])   # new latents (seed 2)
    assert (out / "config.json").read_text() == config_before   # the run itself is untouched
    # The new set's authors' pickles have the run's names and the new samples.
    pickles = sorted(new_set.glob("*.data-*.pkl"),
                     key=lambda p: int(p.name.rsplit("-", 1)[1][:-4]))
    assert [p.name for p in pickles] == pickle_names
    xa, ya = export.read_authors_pickles([str(p) for p in pickles], (28, 28, 1), 10)
    np.testing.assert_array_equal(xa, samples["x"])
    np.testing.assert_array_equal(ya, samples["y"])
    assert "sampling" in capsys.readouterr().out


def test_training_into_a_finished_run_with_other_flags_is_refused(cli_run, tiny_fmnist_dir,
                                                                   capsys):
    code, out = cli_run
    assert code == 0
    privacy = (out / "privacy.json").read_text()
    code = cli.main(["--dataset", "fashion_mnist", "--data_dir", str(tiny_fmnist_dir), "--train",
                     "--max_records", "80", "--batch_teachers", "4", "--checkpoint_dir", str(out),
                     "--quiet"])
    assert code == 2
    assert "holds a run with other settings" in capsys.readouterr().err
    assert (out / "privacy.json").read_text() == privacy


def test_sampling_mode_on_empty_dir(tmp_path, capsys):
    empty = tmp_path / "empty"
    code = cli.main(["--checkpoint_dir", str(empty), "--dataset", "fashion_mnist"])
    assert code == 2
    err = capsys.readouterr().err
    assert "train a model first" in err
    assert not empty.exists()


def test_help_lists_supported_flags_only(capsys):
    with pytest.raises(SystemExit) as excinfo:
        cli.main(["--help"])
    assert excinfo.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--sigma", "--topk", "--thresh", "--batch_teachers", "--teachers_batch",
                 "--checkpoint_dir", "--nostochastic", "--non_private"):
        assert flag in out
    assert "--wgan" not in out and "--mean_kernel" not in out
    assert "--save_vote" in out and "--aggregation" in out


def test_help_gives_every_flag_a_line_and_its_effective_default(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in out and "--nonon_private" not in out
    parser = cli.build_parser()
    for action in parser._actions:                 # pylint: disable=protected-access
        if action.option_strings and action.help != "==SUPPRESS==":
            assert action.help, action.option_strings
    demo = cfg.preset("demo")
    # The values a flag takes when not given: the demo's and the authors' main.py defaults.
    assert f"[demo: {demo.topagg.sigma}; with --dataset: {cli.AUTHORS_DEFAULTS['sigma']}]" in out
    assert f"[demo: {demo.train.num_teachers} teachers in all; with --dataset: 1]" in out
    assert "--checkpoint_every CHECKPOINT_EVERY generator steps between checkpoints" in out
    assert "[default: 10]" in out


def test_enum_flags_resolve_to_their_enums():
    """--conv_path and --fake_rendering reach the config as enums (a string was refused)."""
    _, config, _, _ = resolve("--conv_path", "per_teacher", "--fake_rendering",
                              "teacher_labels")
    assert config.train.conv_path is cfg.ConvPath.PER_TEACHER
    assert config.train.fake_rendering is cfg.FakeRendering.TEACHER_LABELS
    _, default, _, _ = resolve()
    assert default.train.fake_rendering is cfg.FakeRendering.CLASS_GRID


def test_dataset_celeba_is_celeba_gender_with_a_note(capsys):
    _, config, _, _ = resolve("--dataset", "celebA")
    assert config.train.dataset == "celebA-gender-train"
    assert "celebA-gender-train" in capsys.readouterr().out


@pytest.mark.parametrize("flags, method, klevel", [
    (("--dataset", "fashion_mnist", "--klevelsgd", "--klevel", "3"), "klevel", 3),
    (("--dataset", "fashion_mnist", "--signsgd_nothresh", "--stochastic"), "no_threshold", 4),
    (("--aggregation", "no_topk"), "no_topk", 4),
    (("--sketchsgd",), "fetchsgd", 4),
    (("--dataset", "fashion_mnist", "--signsgd", "--nostochastic"), "topk_sign", 4),
    # The deterministic sign without threshold: the authors' signsgd_aggregate_no_thresh
    # with their default --nostochastic, also under explicit --nostochastic and --nosignsgd
    # (their default: their dispatch reaches --signsgd_nothresh only with --signsgd off).
    (("--dataset", "fashion_mnist", "--signsgd_nothresh"), "no_threshold_sign", 4),
    (("--signsgd_nothresh", "--nostochastic"), "no_threshold_sign", 4),
    (("--dataset", "fashion_mnist", "--nosignsgd", "--signsgd_nothresh", "--stochastic"),
     "no_threshold", 4),
    (("--nosignsgd", "--klevelsgd"), "klevel", 4),
    # --signsgd_dept is their thresholded sign too (with the bound spent; dclens records
    # it only): deterministic unless --stochastic, as theirs.
    (("--dataset", "fashion_mnist", "--signsgd_dept"), "topk_sign", 4),
    (("--dataset", "fashion_mnist", "--signsgd_dept", "--stochastic"), "topk_stochastic_sign",
     4),
    # A preset with the stochastic sign keeps it when --stochastic is not given.
    (("--preset", "fashion_mnist-eps1", "--signsgd_nothresh"), "no_threshold", 4),
])
def test_the_authors_ablation_flags_map_onto_the_aggregation_enum(flags, method, klevel):
    _, config, _, _ = resolve(*flags)
    assert config.topagg.method is cfg.Aggregation(method)
    assert config.topagg.klevel == klevel


@pytest.mark.parametrize("flags, message", [
    (("--klevelsgd", "--aggregation", "no_topk"), "name different aggregations"),
    (("--sketchsgd", "--klevelsgd"), "name different aggregations"),
    # The authors' dispatch runs --signsgd's thresholded sign and ignores the other flag.
    (("--signsgd", "--signsgd_nothresh"), "runs --signsgd's .* ignores --signsgd_nothresh"),
    (("--dataset", "fashion_mnist", "--signsgd", "--klevelsgd"), "ignores --klevelsgd"),
    (("--signsgd", "--sketchsgd"), "ignores --sketchsgd"),
    # Alone, --nosignsgd is the authors' G-PATE gradient voting, not implemented.
    (("--nosignsgd", "--aggregation", "klevel"), "G-PATE"),
    (("--nosignsgd", "--signsgd_dept"), "spends the data-dependent bound"),
])
def test_conflicting_or_missing_aggregations_are_refused(flags, message):
    with pytest.raises(cli.CliError, match=message):
        resolve(*flags)


def test_every_refused_authors_flag_is_listed_with_its_reason_in_the_docs():
    """docs/authors.md lists every flag of the authors' main.py that dclens refuses by
    name, in its table of refused flag combinations."""
    page = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "authors.md").read_text()
    start = page.index("### Flag combinations dclens refuses")
    table = page[start:page.index("\n## ", start)]
    missing = [name for name in [*cli.UNSUPPORTED_AUTHORS_FLAGS, "pretrain", "nosignsgd"]
               if not re.search(rf"[` ]--{name}[ `]", table)]
    assert not missing, missing


# The authors' README Fashion-MNIST eps = 1 command, as written there (checkpoint dir aside).
AUTHORS_README_FMNIST_EPS1 = (
    "--checkpoint_dir ckpt --topk 200 --signsgd --norandom_proj --shuffle --teachers_batch 80 "
    "--batch_teachers 50 --dataset fashion_mnist --train --max_eps 1 --train --thresh 0.9 "
    "--sigma 5000 --nopretrain --z_dim 50 --nosave_epoch --epoch 300 --save_vote --d_step 2 "
    "--pretrain_teacher 10 --stochastic --max_grad 1e-5").split()


def test_the_authors_readme_command_runs_as_written():
    """Their paper commands carry --norandom_proj (unread beside --signsgd) and
    --nosave_epoch (their default): accepted, and the rest is their configuration."""
    name, config, do_train, output = resolve(*AUTHORS_README_FMNIST_EPS1)
    assert name == "authors" and do_train and output == "ckpt"
    assert config.train.num_teachers == 4000 and config.train.balanced_partition
    assert (config.topagg.topk, config.topagg.sigma, config.topagg.thresh) == (200, 5000.0, 0.9)
    assert config.topagg.method is cfg.Aggregation.TOPK_STOCHASTIC_SIGN
    assert (config.train.z_dim, config.train.d_step, config.train.epochs) == (50, 2, 300)
    without = [flag for flag in AUTHORS_README_FMNIST_EPS1
               if flag not in ("--norandom_proj", "--nosave_epoch")]
    assert resolve(*without)[1] == config


@pytest.mark.parametrize("flag", [f"--no{name}" for name in cli.OFF_IS_DCLENS]
                         + [f"--{name}=false" for name in cli.OFF_IS_DCLENS])
def test_an_off_state_that_is_dclens_is_accepted_and_changes_nothing(flag):
    assert resolve("--signsgd", flag)[1] == resolve("--signsgd")[1]
    name = flag.removeprefix("--no").removeprefix("--").removesuffix("=false")
    with pytest.raises(cli.CliError, match=f"--{name}"):
        resolve("--signsgd", f"--{name}")


def test_save_vote_flags():
    assert resolve()[1].train.save_votes is cfg.SaveVotes.NONE
    assert resolve("--save_vote")[1].train.save_votes is cfg.SaveVotes.UPDATES
    assert resolve("--save_vote", "--save_raw_votes")[1].train.save_votes \
        is cfg.SaveVotes.RAW_SUMS
    assert resolve("--signsgd_dept")[1].train.data_dependent_analysis is True


def test_run_dir_is_the_same_flag_as_checkpoint_dir():
    """Every other dclens tool names its output folder --run_dir; main.py keeps the
    authors' --checkpoint_dir and accepts --run_dir for the same setting."""
    parser = cli.build_parser()
    assert parser.parse_args(["--run_dir", "runs/x"]).checkpoint_dir == "runs/x"
    assert parser.parse_args(["--checkpoint_dir", "runs/y"]).checkpoint_dir == "runs/y"


# ------------------------------------------------------------ every tool: no abbreviations

CLI_FOLDER = pathlib.Path(__file__).resolve().parents[1] / "dclens" / "cli"
TOOLS_WITH_PARSERS = sorted(path.stem for path in CLI_FOLDER.glob("*.py")
                            if "def build_parser" in path.read_text())


@pytest.mark.parametrize("name", TOOLS_WITH_PARSERS)
def test_no_tool_takes_an_abbreviated_flag(name):
    """argparse's default would read ``--iter`` as ``--iterations``: a typo silently
    becoming a setting.  Every tool refuses abbreviations."""
    parser = importlib.import_module(f"dclens.cli.{name}").build_parser()
    assert parser.allow_abbrev is False, f"scripts/{name}.py accepts abbreviated flags"


def test_privacy_gswgan_refuses_an_abbreviated_flag(capsys):
    privacy = load_script("privacy")
    with pytest.raises(SystemExit) as stop:
        privacy.main(["gswgan", "--target_eps", "10", "--iter", "2000"])
    assert stop.value.code == 2
    assert "unrecognized arguments: --iter" in capsys.readouterr().err
