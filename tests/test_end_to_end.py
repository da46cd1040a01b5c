"""A few-step DataLens run on tiny data writes every output and respects the budget."""

import gc
import json
import os
import shutil
import weakref

import numpy as np
import pytest

from dclens.privacy import accounting
from dclens.common import export
from dclens.datalens import outputs, run, step_log
from dclens.datalens.train import DataLens
from dclens.datalens.config import BudgetConfig, DataLensConfig, SaveVotes, TopAggConfig, TrainConfig

TEACHERS, RECORDS, BATCH = 4, 80, 10          # partitions of 20 records, batch 10
SIGMA, TOPK = 20.0, 50
QUERIES_PER_STEP = BATCH


def _budget_for_steps(steps: int) -> float:
    """A max_eps that admits exactly ``steps`` steps (midway to the next step's epsilon)."""
    curve = accounting.epsilon_curve(sigma=SIGMA, topk=TOPK, queries_per_step=QUERIES_PER_STEP,
                                     steps=steps + 1, delta=1e-5,
                                     conversion=accounting.Conversion.CLASSIC)
    return (curve[steps - 1].epsilon + curve[steps].epsilon) / 2


def tiny_config(data_dir, *, seed=3, steps=3, non_private=False) -> DataLensConfig:
    return DataLensConfig(
        train=TrainConfig(dataset="fashion_mnist", data_dir=str(data_dir), num_teachers=TEACHERS,
                          batch_size=BATCH, epochs=5, d_step=1, pretrain_teacher=2, z_dim=8,
                          seed=seed, teacher_chunk=3, num_samples=60, max_records=RECORDS,
                          non_private=non_private),
        topagg=TopAggConfig(topk=TOPK, sigma=0.0 if non_private else SIGMA, thresh=0.25),
        budget=BudgetConfig(max_eps=_budget_for_steps(steps)))


@pytest.fixture(scope="module")
def finished_run(tiny_fmnist_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "out"
    config = tiny_config(tiny_fmnist_dir)
    summary = run.train_run(config, str(out), progress=False, log=lambda _: None)
    return config, summary, out


def test_every_output_is_written(finished_run):
    config, summary, out = finished_run
    names = set(os.listdir(out))
    expected = {"config.json", "privacy.json", "generator.keras", "samples.npz", "samples.png",
                "logs"} | {f"eps-{summary.epsilon:.2f}.data-{i}.pkl" for i in range(10)}
    assert expected <= names, expected - names
    assert not [n for n in names if n.startswith(".tmp-")]   # no temporary left behind
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(out / "logs"))


def test_the_run_directory_says_what_is_private_and_where_it_came_from(finished_run):
    """A README naming each file and whether it may be published, PRIVATE markers in the
    private folders, and the command line, commit, package versions and CPU in config.json."""
    _, _, out = finished_run
    readme = (out / "README.md").read_text()
    assert "`checkpoints/`" in readme and "**no** (PRIVATE)" in readme
    for folder in ("checkpoints", "logs"):
        assert "do not publish" in (out / folder / "PRIVATE").read_text()
    provenance = json.loads((out / "config.json").read_text())["provenance"]
    assert provenance["packages"]["tensorflow"] and provenance["python"]
    assert isinstance(provenance["command"], str) and provenance["command"]
    assert provenance["git"] is None or len(provenance["git"]["commit"]) == 40
    assert provenance["machine"]["cpu"] and provenance["machine"]["cpu_count"] >= 1
    assert isinstance(provenance["machine"]["cpu_vector_extensions"], list)


def test_budget_stops_before_exceeding(finished_run):
    config, summary, out = finished_run
    assert summary.stop_reason == "budget"
    assert summary.steps == 3
    assert summary.queries == 3 * QUERIES_PER_STEP
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["conversion"] == "classic"
    assert privacy["epsilon"]["epsilon"] <= config.budget.max_eps
    assert [p["step"] for p in privacy["epsilon_per_step"]] == [1, 2, 3]
    want = accounting.epsilon_curve(sigma=SIGMA, topk=TOPK, queries_per_step=QUERIES_PER_STEP,
                                    steps=3, delta=1e-5,
                                    conversion=accounting.Conversion.CLASSIC)
    got = [p["epsilon"] for p in privacy["epsilon_per_step"]]
    np.testing.assert_allclose(got, [w.epsilon for w in want], rtol=1e-12)
    # The fourth step would have exceeded the budget.
    fourth = accounting.epsilon_for(sigma=SIGMA, topk=TOPK, queries_per_step=QUERIES_PER_STEP,
                                    steps=4, delta=1e-5, conversion=accounting.Conversion.CLASSIC)
    assert fourth.epsilon > config.budget.max_eps
    ledger = accounting.PrivacyLedger.from_state_dict(privacy["ledger"])
    assert ledger.queries == 3 * QUERIES_PER_STEP
    assert set(privacy["epsilon_all_conversions"]) == {"classic", "dp_accounting", "pld"}
    assert privacy["reproducible_noise"] is True
    # How the settings were chosen is outside the ledger, and the record says so.
    assert privacy["hyperparameter_selection"] == accounting.HYPERPARAMETER_SELECTION
    assert "not covered by epsilon" in privacy["hyperparameter_selection"]


def test_samples_and_authors_layout(finished_run):
    config, _, out = finished_run
    samples = np.load(out / "samples.npz")
    x, y = samples["x"], samples["y"]
    assert x.shape == (60, 28, 28, 1) and x.dtype == np.float32
    assert 0.0 <= x.min() and x.max() <= 1.0
    assert set(np.unique(y)) <= set(range(10))
    paths = sorted((str(p) for p in out.glob("eps-*.data-*.pkl")),
                   key=lambda p: int(p.rsplit("-", 1)[1].split(".")[0]))
    xa, ya = export.read_authors_pickles(paths, (28, 28, 1), 10)
    np.testing.assert_array_equal(xa, x)
    np.testing.assert_array_equal(ya, y)
    saved = json.loads((out / "config.json").read_text())
    assert saved["config"] == config.to_dict()
    assert saved["batch"] == BATCH


def test_same_seed_same_samples_different_seed_differs(finished_run, tiny_fmnist_dir, tmp_path):
    _, _, out = finished_run
    again = run.train_run(tiny_config(tiny_fmnist_dir), str(tmp_path / "again"),
                          progress=False, log=lambda _: None)
    assert again.steps == 3
    first = np.load(out / "samples.npz")["x"]
    np.testing.assert_array_equal(np.load(tmp_path / "again" / "samples.npz")["x"], first)
    run.train_run(tiny_config(tiny_fmnist_dir, seed=4), str(tmp_path / "other"),
                  progress=False, log=lambda _: None)
    assert not np.array_equal(np.load(tmp_path / "other" / "samples.npz")["x"], first)


def test_rerun_of_a_finished_run_does_nothing(finished_run, tiny_fmnist_dir):
    _, summary, out = finished_run
    before = {name: (out / name).read_bytes() for name in ("privacy.json", "ledger.json",
                                                           "samples.npz")}
    messages = []
    again = run.train_run(tiny_config(tiny_fmnist_dir), str(out), progress=False,
                          log=messages.append)
    assert again.steps == summary.steps and again.queries == summary.queries
    assert any("already finished" in m for m in messages)
    assert {name: (out / name).read_bytes() for name in before} == before


def test_rerun_of_a_finished_run_reads_only_the_small_records(finished_run, tiny_fmnist_dir,
                                                             monkeypatch):
    """It says 'finished' without loading the data set or any teacher state, and leaves
    no new (empty) TensorBoard event file behind."""
    _, summary, out = finished_run
    events_before = sorted(os.listdir(out / "logs"))
    _rerun_expecting_finished(tiny_config(tiny_fmnist_dir), out, summary, monkeypatch)
    assert sorted(os.listdir(out / "logs")) == events_before


def _rerun_expecting_finished(config, run_dir, summary, monkeypatch) -> None:
    """Runs ``config`` in ``run_dir`` with the data load and the teachers forbidden and
    checks that it says 'already finished' with ``summary``'s steps, spends and epsilon."""
    def must_not_run(*args, **kwargs):
        raise AssertionError("a finished run must not load data or teacher state")

    with monkeypatch.context() as patched:
        patched.setattr(run, "load_training_data", must_not_run)
        patched.setattr("dclens.datalens.train.DataLens", must_not_run)
        messages = []
        again = run.train_run(config, str(run_dir), progress=False, log=messages.append)
    assert messages and "already finished" in messages[-1]
    assert (again.steps, again.queries, again.stop_reason) == (
        summary.steps, summary.queries, summary.stop_reason)
    assert again.epsilon == pytest.approx(summary.epsilon, rel=1e-12)


def test_a_finished_run_without_its_checkpoints_is_still_finished(finished_run,
                                                                  tiny_fmnist_dir, tmp_path,
                                                                  monkeypatch):
    """The docs say a finished run's checkpoints/ may be deleted to free the disk: the same
    command then says 'finished' from privacy.json and the ledger (no data, no teachers)
    and changes nothing; a larger budget, which would need the checkpoints to go on, is
    refused by name, and a run cut before its outputs were complete is not 'finished'."""
    _, summary, out = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "checkpoints")
    before = {p.name: p.read_bytes() for p in copy.iterdir() if p.is_file()}
    _rerun_expecting_finished(tiny_config(tiny_fmnist_dir), copy, summary, monkeypatch)
    assert {p.name: p.read_bytes() for p in copy.iterdir() if p.is_file()} == before
    with pytest.raises(run.RunDirError, match="seed.json is missing but .*ledger.json records "
                                          "spends: the run cannot be resumed"):
        run.train_run(tiny_config(tiny_fmnist_dir, steps=4), str(copy), progress=False,
                      log=lambda _: None)
    (copy / "samples.png").unlink()                  # outputs cut short: not finished
    with pytest.raises(run.RunDirError, match="cannot be resumed"):
        run.train_run(tiny_config(tiny_fmnist_dir), str(copy), progress=False,
                      log=lambda _: None)
    assert {p.name: p.read_bytes() for p in copy.iterdir() if p.is_file()} == {
        name: data for name, data in before.items() if name != "samples.png"}


def test_a_larger_budget_extends_a_finished_run(finished_run, tiny_fmnist_dir, tmp_path):
    """More budget than the saved run may allow more steps: the quick path stands aside."""
    _, summary, out = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    bigger = tiny_config(tiny_fmnist_dir, steps=4)
    more = run.train_run(bigger, str(copy), progress=False, log=lambda _: None)
    assert more.steps == summary.steps + 1
    # The earlier budget's pickles are set aside, not left beside the new ones (where
    # they could be mistaken for the run's samples) and not deleted.
    old = {f"eps-{summary.epsilon:.2f}.data-{i}.pkl" for i in range(10)}
    new = {f"eps-{more.epsilon:.2f}.data-{i}.pkl" for i in range(10)}
    assert old != new
    names = set(os.listdir(copy))
    assert new <= names and not old & names
    assert set(os.listdir(copy / "superseded")) == old


def test_refuses_directory_of_a_run_with_other_settings(finished_run, tiny_fmnist_dir):
    _, _, out = finished_run
    before = (out / "privacy.json").read_text()
    changed = tiny_config(tiny_fmnist_dir).replace(topagg={"sigma": SIGMA * 2})
    with pytest.raises(run.RunDirError, match=r"topagg\.sigma \(privacy-relevant\): saved "
                                              r"20\.0, now 40\.0"):
        run.train_run(changed, str(out), progress=False, log=lambda _: None)
    assert (out / "privacy.json").read_text() == before


def test_non_private_run_says_so(tiny_fmnist_dir, tmp_path):
    messages = []
    config = tiny_config(tiny_fmnist_dir, non_private=True).replace(train={"epochs": 1})
    summary = run.train_run(config, str(tmp_path / "np"), progress=False, log=messages.append)
    assert summary.epsilon is None and summary.stop_reason == "epochs"
    assert any("NOT private" in m for m in messages)
    privacy = json.loads((tmp_path / "np" / "privacy.json").read_text())
    assert privacy["private"] is False and "NOT private" in privacy["warning"]
    assert (tmp_path / "np" / "non_private.data-0.pkl").exists()


def test_sample_mode_reloads_generator(finished_run, tmp_path):
    _, _, out = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    paths = outputs.sample_run(str(copy), num_samples=30, seed=1, log=lambda _: None)
    assert np.load(paths["samples"])["x"].shape == (30, 28, 28, 1)
    with pytest.raises(run.RunDirError, match="train a model first"):
        outputs.sample_run(str(tmp_path / "empty"), log=lambda _: None)


# ------------------------------------------------------------------ --save_vote
@pytest.mark.parametrize("kind", [SaveVotes.UPDATES, SaveVotes.RAW_SUMS])
def test_save_vote_writes_the_released_updates_and_raw_sums_only_when_asked(
        kind, tiny_fmnist_dir, tmp_path):
    config = tiny_config(tiny_fmnist_dir, steps=2)
    config = config.replace(train={"save_votes": kind})
    out = tmp_path / "run"
    summary = run.train_run(config, str(out), progress=False, log=lambda _: None)
    files = sorted(os.listdir(out / "votes"))
    assert files == [f"step-{s:06d}.npz" for s in range(1, summary.steps + 1)]
    with np.load(out / "votes" / files[0]) as saved:
        update = saved["update"]
        assert update.shape == (1, BATCH, 784)
        assert set(np.unique(update)) <= {-1.0, 0.0, 1.0}
        raw = "vote_sum" in saved.files
        if raw:
            vote_sum = saved["vote_sum"]
    marker = out / outputs.RAW_VOTES_MARKER
    if kind is SaveVotes.UPDATES:
        assert not raw and not marker.exists()
    else:
        assert raw and marker.exists() and "Do not publish" in marker.read_text()
        assert vote_sum.shape == update.shape
        assert np.all(np.abs(vote_sum) <= TEACHERS) and np.abs(vote_sum).sum() > 0


def _grid_titles(monkeypatch) -> list[str]:
    """Collects the titles of every sample grid written (the PNG's pixels hide them)."""
    titles = []
    write = export.write_grid_png

    def spy(path, grid, *, title="", **kwargs):
        titles.append(title)
        return write(path, grid, title=title, **kwargs)
    monkeypatch.setattr(export, "write_grid_png", spy)
    return titles


def test_unproven_fetchsgd_accounting_is_marked_in_the_outputs(tiny_fmnist_dir, tmp_path,
                                                               monkeypatch):
    from dclens.datalens.config import Aggregation, SketchAccounting

    config = tiny_config(tiny_fmnist_dir, steps=1).replace(topagg={
        "method": Aggregation.FETCHSGD, "sketch_columns": 500,
        "sketch_accounting": SketchAccounting.AUTHORS_UNPROVEN})
    titles = _grid_titles(monkeypatch)
    lines = []
    run.train_run(config, str(tmp_path / "run"), progress=False, log=lines.append)
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert privacy["accounting_proven"] is False and privacy["aggregation"] == "fetchsgd"
    assert any("NOT a guarantee" in line for line in lines)
    # The grid carries the caveats too (a figure gets cut out of its run directory), and
    # so does the closing line; this run is also seeded.
    assert titles and all("NOT a proven guarantee" in t and "seeded noise: NOT private" in t
                          for t in titles)
    assert "NOT a proven guarantee" in lines[-1] and "seeded noise" in lines[-1]


def test_an_entropy_noised_proven_run_states_a_bare_epsilon(tiny_fmnist_dir, tmp_path,
                                                            monkeypatch):
    titles = _grid_titles(monkeypatch)
    config = tiny_config(tiny_fmnist_dir, seed=None, steps=1)
    summary = run.train_run(config, str(tmp_path / "run"), progress=False,
                            log=lambda _: None)
    assert len(titles) == 1
    assert titles[0].endswith(f" samples (epsilon={summary.epsilon:.3f}, delta=1e-05)")


def test_the_progress_bar_shows_no_noise_free_function_of_the_private_data():
    """Two steps that differ only in the teachers' loss (computed on private records, no
    noise) show the same progress fields; what is shown is released or public."""
    from dclens.datalens.train import StepRecord

    common = dict(step=3, epoch=0, queries=40, epsilon=0.5, student_loss=0.01,
                  pass_fraction=0.3, seconds=1.0)
    shown = [step_log.progress_fields(StepRecord(teacher_loss=loss, **common))
             for loss in (0.693, 1.386)]
    assert shown[0] == shown[1] == {"eps": "0.5000", "g_loss": "0.01", "passed": "0.300"}


def test_sampling_again_never_overwrites_samples_and_refuses_other_settings(finished_run,
                                                                           tmp_path):
    """main.py without --train used to overwrite samples.npz, the pickles and the grid
    (someone may have evaluated them) and accepted flags the run was not trained with."""
    from conftest import load_script

    _, _, out = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    before = {name: (copy / name).read_bytes() for name in os.listdir(copy)
              if name.startswith(("samples", "eps-"))}
    first = outputs.sample_run(str(copy), num_samples=30, seed=1, log=lambda _: None)
    second = outputs.sample_run(str(copy), num_samples=30, seed=2, log=lambda _: None)
    assert first["samples"] == str(copy / "samples-2" / "samples.npz")
    assert second["samples"] == str(copy / "samples-3" / "samples.npz")
    assert {name: (copy / name).read_bytes() for name in before} == before
    assert len([n for n in os.listdir(copy / "samples-2") if n.endswith(".pkl")]) == 10
    cli = load_script("main")
    code = cli.main(["--checkpoint_dir", str(copy), "--dataset", "mnist"])
    assert code == 2
    assert not (copy / "samples-4").exists()
    with pytest.raises(run.RunDirError, match="train.dataset: the run has 'fashion_mnist', "
                                              "the command 'mnist'"):
        outputs.sample_run(str(copy), expect={"train.dataset": "mnist"}, log=lambda _: None)


def test_train_run_releases_the_trained_lens_before_it_returns(tiny_fmnist_dir, tmp_path,
                                                               monkeypatch):
    """The DataLens of a finished run (its teachers: up to half the RAM at the paper
    scale) sits in reference cycles; train_run collects it before returning, so what its
    caller does next (reproduce.py's evaluation) does not hold the training's memory."""
    alive = weakref.WeakSet()
    original = DataLens.__init__

    def recording_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        alive.add(self)

    monkeypatch.setattr(DataLens, "__init__", recording_init)
    gc.disable()          # only train_run's own collection may free it
    try:
        run.train_run(tiny_config(tiny_fmnist_dir, steps=1), str(tmp_path / "out"),
                      progress=False, log=lambda _: None)
        assert len(alive) == 0, "the trained DataLens is still alive after train_run"
    finally:
        gc.enable()
