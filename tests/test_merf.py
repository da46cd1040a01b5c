"""DP-MERF (``dclens.datalens.merf``) and the DataLens warm start from it (``--warm_start``):

* the features: every feature vector has norm <= 1 by construction (even when floating
  point would give more), the TensorFlow path equals the numpy one, and phi(x)^T phi(x')
  estimates the Gaussian kernel (statistical, tolerance stated);
* the mechanism: the embedding sum equals a loop written out here; one record replaced
  adversarially (same label, other label, extreme images) moves it by at most the
  sensitivity 2 in Frobenius norm; the release adds exactly its seeded Gaussian draw,
  whose standard deviation is 2 z (statistical);
* the run: write-ahead order (a release lost in a crash is spent again, still counted),
  a finished run is not redone, privacy.json's epsilon is the closed form;
* the warm start: the generator starts from the fit, the ledger from the release
  (journaled once, as round -1, also across a crash and resume), the budget plans the
  steps left, and every mismatch is refused by name before anything is written.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil

import dp_accounting
import keras
import numpy as np
import pytest

from dclens.cli import main as main_cli
from dclens.cli import merf as merf_cli
from dclens.cli import reproduce as reproduce_cli
from dclens.datalens import budget, resume, run, warm_start
from dclens.datalens.config import DataLensConfig, TopAggConfig, TrainConfig, BudgetConfig
from dclens.experiments import paper_rows
from dclens.datalens.merf import features as features_lib
from dclens.datalens.merf import fit, mechanism
from dclens.datalens.merf import train as merf_train
from dclens.datalens.merf.config import MerfConfig, MerfConfigError
from dclens.privacy import accounting, exact
from dclens.runs import journal as run_journal
from test_resume import Crash, crash_at

Z_MERF = 2.0
RECORDS = 40


def merf_config(data_dir, **changes) -> MerfConfig:
    settings = dict(dataset="fashion_mnist", data_dir=str(data_dir), max_records=RECORDS,
                    target_eps=None, sigma=Z_MERF, conversion="pld", num_features=64,
                    fit_steps=4, fit_batch=10, z_dim=8, generator_filters=8,
                    generator_dense=16, num_samples=20, seed=3, log_every=2)
    settings.update(changes)
    return MerfConfig(**settings)


def datalens_config(data_dir, warm, **train) -> DataLensConfig:
    settings = dict(dataset="fashion_mnist", data_dir=str(data_dir), num_teachers=2,
                    batch_size=4, epochs=2, d_step=1, pretrain_teacher=1, z_dim=8, seed=3,
                    teacher_chunk=2, num_samples=10, max_records=RECORDS,
                    generator_filters=8, generator_dense=16, warm_start=warm)
    settings.update(train)
    return DataLensConfig(train=TrainConfig(**settings),
                          topagg=TopAggConfig(topk=30, sigma=5.0, thresh=0.2, max_grad=1e-5),
                          budget=BudgetConfig(max_eps=1e6,
                                              conversion=accounting.Conversion.PLD))


@pytest.fixture(scope="module")
def merf_run(tiny_fmnist_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("merf") / "run"
    merf_train.train_merf(merf_config(tiny_fmnist_dir), str(out), log=lambda _: None)
    return out


def _quiet(_line):
    return None


# ------------------------------------------------------------------ features

def test_every_feature_vector_has_norm_at_most_one_and_the_paths_agree():
    rng = np.random.default_rng(0)
    phi = features_lib.draw(784, 256, 8.0, rng)
    images = rng.uniform(size=(50, 28, 28, 1))
    values = phi.numpy(images)
    norms = np.linalg.norm(values, axis=1)
    assert values.shape == (50, 256)
    assert np.all(norms <= 1.0) and np.allclose(norms, 1.0, atol=1e-12)
    np.testing.assert_allclose(phi.tensor(images.astype(np.float32)).numpy(), values,
                               atol=2e-4)


def test_the_norm_bound_holds_by_construction_not_by_arithmetic():
    """Features whose computed norm exceeds 1 (as floating point might give) are clipped."""

    class Inflated(features_lib.FourierFeatures):
        def unclipped(self, images):
            return 3.0 * super().unclipped(images)

    rng = np.random.default_rng(1)
    phi = Inflated(features_lib.draw(784, 500, 2.0, rng).frequencies)
    values = phi.numpy(rng.uniform(size=(200, 784)))
    np.testing.assert_allclose(np.linalg.norm(values, axis=1), 1.0, rtol=1e-12)
    assert np.all(np.linalg.norm(values, axis=1) <= 1.0 + 1e-15)
    small = np.full((2, 4), 0.1)
    np.testing.assert_array_equal(features_lib.clip_to_unit_norm(small), small)
    broken = np.array([[np.nan, 0.1, 0.1, 0.1], [np.inf, 0, 0, 0], [0.1, 0.1, 0.1, 0.1]])
    clipped = features_lib.clip_to_unit_norm(broken)
    np.testing.assert_array_equal(clipped[:2], 0.0)
    np.testing.assert_array_equal(clipped[2], broken[2])


def test_a_non_finite_record_moves_the_sum_by_at_most_two():
    rng = np.random.default_rng(8)
    phi = features_lib.draw(784, 64, 3.0, rng)
    images, labels = rng.uniform(size=(5, 28, 28, 1)), np.arange(5)
    base = mechanism.embedding_sum(phi, images, labels, 10)
    for bad in (np.nan, np.inf, -np.inf):
        changed = images.copy()
        changed[0, 3, 3, 0] = bad
        moved = mechanism.embedding_sum(phi, changed, labels, 10) - base
        assert np.all(np.isfinite(moved)) and np.linalg.norm(moved) <= 2.0


def test_the_features_estimate_the_gaussian_kernel():
    """phi(x)^T phi(x') is a mean of D/2 cosines: its sd is at most sqrt(2 / D) ~ 0.014 at
    D = 10,000; the tolerance 0.06 is four of those."""
    rng = np.random.default_rng(2)
    lengthscale = 6.0
    phi = features_lib.draw(784, 10_000, lengthscale, rng)
    x = rng.uniform(size=(6, 784)) * np.array([0.05, 0.2, 0.4, 0.6, 0.8, 1.0])[:, None]
    gram = phi.numpy(x) @ phi.numpy(x).T
    distances = ((x[:, None] - x[None]) ** 2).sum(-1)
    kernel = np.exp(-distances / (2 * lengthscale ** 2))
    assert np.abs(gram - kernel).max() < 0.06
    assert kernel[~np.eye(6, dtype=bool)].std() > 0.05        # the kernel varies here


def test_bad_feature_settings_are_refused_by_value():
    with pytest.raises(ValueError, match="even integer >= 2.*got 7"):
        features_lib.draw(784, 7, 1.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="lengthscale.*got -1"):
        features_lib.draw(784, 8, -1.0, np.random.default_rng(0))


# ------------------------------------------------------------------ mechanism

def test_the_embedding_sum_is_the_sum_written_out():
    rng = np.random.default_rng(3)
    phi = features_lib.draw(784, 32, 5.0, rng)
    images, labels = rng.uniform(size=(9, 28, 28, 1)), rng.integers(0, 10, 9)
    expected = np.zeros((32, 10))
    for image, label in zip(images, labels):
        expected[:, label] += phi.numpy(image[None])[0]
    np.testing.assert_allclose(mechanism.embedding_sum(phi, images, labels, 10, chunk=4),
                               expected, atol=1e-12)


@pytest.mark.parametrize("lengthscale", [0.05, 3.0, 1000.0])
def test_one_record_replaced_adversarially_moves_the_sum_by_at_most_two(lengthscale):
    """The sensitivity proof: replace one record of a dataset by the image and label that
    move S the most among candidates (black, white, noise, the record's negative; its own
    label and every other) -- the Frobenius change never exceeds 2."""
    rng = np.random.default_rng(4)
    phi = features_lib.draw(784, 512, lengthscale, rng)
    images, labels = rng.uniform(size=(30, 28, 28, 1)), rng.integers(0, 10, 30)
    base = mechanism.embedding_sum(phi, images, labels, 10)
    candidates = [np.zeros((28, 28, 1)), np.ones((28, 28, 1)), 1 - images[0],
                  rng.uniform(size=(28, 28, 1)), images[0] + 0.5 / lengthscale]
    largest = 0.0
    for image in candidates:
        for label in range(10):
            changed_images, changed_labels = images.copy(), labels.copy()
            changed_images[0], changed_labels[0] = image, label
            moved = mechanism.embedding_sum(phi, changed_images, changed_labels, 10) - base
            largest = max(largest, np.linalg.norm(moved))
    assert largest <= mechanism.SENSITIVITY + 1e-9
    assert largest > 1.0          # the adversary does move it (the test can fail)


def test_the_release_adds_exactly_its_seeded_draw_of_sd_2z():
    total = np.arange(60_000, dtype=np.float64).reshape(600, 100)
    released = mechanism.release(total, 1.5, np.random.default_rng(7))
    noise = released - total
    np.testing.assert_array_equal(
        noise, total + np.random.default_rng(7).normal(0.0, 3.0, size=total.shape) - total)
    # 60,000 draws: the sample sd is within 1% of 3 with probability > 0.999.
    assert abs(noise.std() / 3.0 - 1) < 0.01 and abs(noise.mean()) < 0.05
    with pytest.raises(ValueError, match="noise_multiplier"):
        mechanism.release(total, 0.0, np.random.default_rng(7))


def test_the_fit_loss_is_the_formula_and_the_fit_lowers_it():
    rng = np.random.default_rng(5)
    phi = features_lib.draw(784, 64, 4.0, rng)
    images = rng.uniform(size=(10, 28, 28, 1)).astype(np.float32)
    one_hot = np.eye(10, dtype=np.float32)[np.arange(10)]
    target = rng.normal(size=(64, 10)).astype(np.float32) * 0.01
    expected = ((target - phi.numpy(images).T @ one_hot / 10) ** 2).sum()
    assert float(fit.embedding_loss(phi, target, images, one_hot)) == pytest.approx(
        expected, rel=1e-4)
    generator = merf_train.build_generator(merf_config("unused"), _shape(), seed=1)
    real = phi.numpy(rng.uniform(size=(40, 784)) > 0.7)
    goal = np.stack([real[i::10].mean(0) / 10 for i in range(10)], axis=1)
    losses = fit.fit_generator(generator, phi, goal, steps=60, batch=20, learning_rate=1e-2,
                               beta1=0.5, rng=np.random.default_rng(6), log=_quiet)
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])


def _shape():
    from dclens.datalens.networks import ImageShape
    return ImageShape(28, 28, 1, 10)


# ------------------------------------------------------------------ the run

def test_a_run_writes_its_release_first_and_accounts_it_exactly(merf_run):
    names = set(os.listdir(merf_run))
    assert {"config.json", "ledger.json", "release.npz", "generator.keras", "samples.npz",
            "samples.png", "privacy.json", "report.json"} <= names
    privacy = json.loads((merf_run / "privacy.json").read_text())
    assert privacy["epsilon"]["epsilon"] == pytest.approx(
        exact.gaussian_epsilon(1 / Z_MERF, 1e-5), rel=1e-9)
    assert privacy["releases"] == 1 and privacy["sensitivity"] == 2.0
    journal = json.loads((merf_run / "ledger.json").read_text())
    assert journal["entries"] == [{"step": 0, "round": 0, "queries": 1}]
    release = np.load(merf_run / "release.npz")
    assert release["noisy_sum"].shape == (64, 10) and int(release["records"]) == RECORDS
    samples = np.load(merf_run / "samples.npz")
    assert samples["x"].shape == (20, 28, 28, 1)


def test_a_release_lost_in_a_crash_is_spent_again_and_a_finished_run_is_not_redone(
        tiny_fmnist_dir, tmp_path):
    out = tmp_path / "run"
    config = merf_config(tiny_fmnist_dir, fit_steps=1)
    merf_train.train_merf(config, str(out), log=_quiet)
    first = np.load(out / "release.npz")["noisy_sum"]
    # A crash after the spend was journaled and before release.npz landed:
    os.remove(out / "release.npz")
    os.remove(out / "report.json")
    merf_train.train_merf(config, str(out), log=_quiet)
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["releases"] == 2                      # the lost one stays counted
    assert privacy["lost_releases"] == 1
    assert privacy["epsilon"]["epsilon"] == pytest.approx(
        exact.gaussian_epsilon(math.sqrt(2) / Z_MERF, 1e-5), rel=1e-9)
    second = np.load(out / "release.npz")
    assert int(second["attempt"]) == 1
    assert not np.array_equal(second["noisy_sum"], first)  # fresh noise
    # finished: a repeat reads the report and spends nothing
    merf_train.train_merf(config, str(out), log=_quiet)
    assert json.loads((out / "privacy.json").read_text())["releases"] == 2


def test_the_spend_is_journaled_before_the_noise_is_drawn(tiny_fmnist_dir, tmp_path,
                                                          monkeypatch):
    """A crash while the release is drawn (after the spend, before release.npz): the
    journal already counts it; the resume lists it as lost and releases again."""
    out = tmp_path / "run"
    config = merf_config(tiny_fmnist_dir, fit_steps=1)

    def crash(*_args, **_kwargs):
        raise Crash("release")

    with monkeypatch.context() as patch:
        patch.setattr(mechanism, "release", crash)
        with pytest.raises(Crash):
            merf_train.train_merf(config, str(out), log=_quiet)
    journal = json.loads((out / "ledger.json").read_text())
    assert journal["entries"] == [{"step": 0, "round": 0, "queries": 1}]
    assert journal["ledger"]["spends"] == [{"noise_multiplier": Z_MERF, "count": 1}]
    assert not (out / "release.npz").exists()
    merf_train.train_merf(config, str(out), log=_quiet)
    privacy = json.loads((out / "privacy.json").read_text())
    assert (privacy["releases"], privacy["lost_releases"]) == (2, 1)
    assert int(np.load(out / "release.npz")["attempt"]) == 1
    assert len(json.loads((out / "ledger.json").read_text())["lost"]) == 1


def test_a_refit_reads_only_the_release_and_checks_it_is_this_runs(tiny_fmnist_dir, tmp_path,
                                                                   monkeypatch):
    """After the release, a crash in the fit: the resume refits from release.npz without
    reading a training record (the loader raises), to the same generator and samples; a
    release made for another record count, noise or feature draw is refused by name."""
    out = tmp_path / "run"
    config = merf_config(tiny_fmnist_dir, fit_steps=2)
    merf_train.train_merf(config, str(out), log=_quiet)
    samples = np.load(out / "samples.npz")["x"]
    ledger = (out / "ledger.json").read_bytes()
    for name in ("report.json", "generator.keras", "samples.npz", "privacy.json"):
        os.remove(out / name)

    def no_records(*_args, **_kwargs):
        raise AssertionError("a refit read the training records")

    monkeypatch.setattr(merf_train.splits, "load_training_records", no_records)
    lines = []
    merf_train.train_merf(config, str(out), log=lines.append)
    np.testing.assert_allclose(np.load(out / "samples.npz")["x"], samples, atol=1e-6)
    assert (out / "ledger.json").read_bytes() == ledger          # nothing spent
    assert any("training records are not read" in line for line in lines)
    release = dict(np.load(out / "release.npz"))
    for key, value, match in (("records", np.int64(RECORDS + 1), "41 records, this run 40"),
                              ("noise_multiplier", np.float64(2.5), "noise multiplier 2.5"),
                              ("features_sha256", np.str_("0" * 64), "other random features")):
        np.savez(out / "release.npz", **{**release, key: value})
        (out / "report.json").unlink(missing_ok=True)
        with pytest.raises(merf_train.rundir.RunDirError, match=match):
            merf_train.train_merf(config, str(out), log=_quiet)


def test_a_crash_while_the_run_files_are_created_resumes_with_all_of_them(
        tiny_fmnist_dir, tmp_path, monkeypatch):
    """Killed after config.json, before the seed file and the journal (nothing spent): the
    resume writes the README, the PRIVATE markers and the seed file, releases once, and a
    later resume finds the seed it drew with."""
    out = tmp_path / "run"
    config = merf_config(tiny_fmnist_dir, fit_steps=1, seed=None)

    def crash(*_args, **_kwargs):
        raise Crash("write_seed")

    with monkeypatch.context() as patch:
        patch.setattr(merf_train.rundir, "write_seed", crash)
        with pytest.raises(Crash):
            merf_train.train_merf(config, str(out), log=_quiet)
    assert (out / "config.json").exists() and not (out / "ledger.json").exists()
    os.remove(out / "README.md")                 # as if killed before it, too
    merf_train.train_merf(config, str(out), log=_quiet)
    for name in ("README.md", "checkpoints/seed.json", "checkpoints/PRIVATE", "logs/PRIVATE"):
        assert (out / name).exists(), name
    assert json.loads((out / "privacy.json").read_text())["releases"] == 1
    os.remove(out / "report.json")               # a crash in the fit: resumes, no spend
    merf_train.train_merf(config, str(out), log=_quiet)
    assert json.loads((out / "privacy.json").read_text())["releases"] == 1


def test_a_finished_run_draws_another_number_of_samples_from_its_generator_at_no_cost(
        tiny_fmnist_dir, tmp_path):
    """--num_samples on a finished run: the saved generator (post-processing of the
    release) draws the new number; the release, the ledger and the generator stay as they
    were, and the same labels come from the same stream as in a fresh run of that size."""
    out = tmp_path / "run"
    config = merf_config(tiny_fmnist_dir, fit_steps=1)
    merf_train.train_merf(config, str(out), log=_quiet)
    untouched = {name: (out / name).read_bytes() for name in
                 ("privacy.json", "release.npz", "generator.keras", "ledger.json")}
    lines = []
    report = merf_train.train_merf(dataclasses.replace(config, num_samples=35), str(out),
                                   log=lines.append)
    samples = np.load(out / "samples.npz")
    assert samples["x"].shape == (35, 28, 28, 1) and report["num_samples"] == 35
    assert np.load(out / "samples-20.npz")["x"].shape == (20, 28, 28, 1)   # kept
    assert json.loads((out / "report.json").read_text())["num_samples"] == 35
    assert "drew 35 samples from its fitted generator instead of 20" in lines[-1]
    assert "no new spend" in lines[-1]
    assert {name: (out / name).read_bytes() for name in untouched} == untouched
    fresh = tmp_path / "fresh"
    merf_train.train_merf(dataclasses.replace(config, num_samples=35), str(fresh), log=_quiet)
    again = np.load(fresh / "samples.npz")
    np.testing.assert_array_equal(again["y"], samples["y"])
    np.testing.assert_allclose(again["x"], samples["x"], atol=1e-6)
    lines.clear()                           # the same number again: nothing is redrawn
    merf_train.train_merf(dataclasses.replace(config, num_samples=35), str(out),
                          log=lines.append)
    assert "is finished (report.json)" in lines[-1]


def test_calibration_finds_the_noise_of_the_target_epsilon():
    for conversion in accounting.Conversion:
        z = merf_train.calibrated_noise_multiplier(1.0, 1e-5, conversion)
        ledger = accounting.PrivacyLedger(delta=1e-5, conversion=conversion)
        ledger.spend(mechanism.event(z))
        assert ledger.epsilon().epsilon == pytest.approx(1.0, rel=1e-6)
    assert merf_train.calibrated_noise_multiplier(
        1.0, 1e-5, accounting.Conversion.PLD) == pytest.approx(1 / 0.26805, rel=1e-4)


def test_bad_settings_are_refused_by_name_and_value():
    with pytest.raises(MerfConfigError, match="num_features = 7"):
        MerfConfig(num_features=7)
    with pytest.raises(MerfConfigError, match="noise_scale = 2"):
        MerfConfig(noise_scale=2)
    with pytest.raises(MerfConfigError, match="fit_batch = 15"):
        MerfConfig(fit_batch=15)
    with pytest.raises(MerfConfigError, match="exactly one of target_eps"):
        MerfConfig(sigma=3.0)
    with pytest.raises(SystemExit):
        merf_cli.main(["--run_dir", "x", "--num_features", "7"])


# ------------------------------------------------------------------ the warm start

def test_a_warm_started_run_starts_from_the_fit_and_counts_the_release_once(
        merf_run, tiny_fmnist_dir, tmp_path):
    config = datalens_config(tiny_fmnist_dir, str(merf_run))
    from dclens import data
    from dclens.datalens.train import DataLens
    records = data.load_dataset("fashion_mnist", str(tiny_fmnist_dir), limit=RECORDS,
                                progress=False)
    lens = DataLens(config, records, root_seed=3)
    fitted = keras.models.load_model(merf_run / "generator.keras", compile=False)
    for ours, theirs in zip(lens.generator.get_weights(), fitted.get_weights()):
        np.testing.assert_array_equal(ours, theirs)
    cold = DataLens(datalens_config(tiny_fmnist_dir, None), records, root_seed=3)
    assert any(not np.array_equal(a, b) for a, b in
               zip(cold.generator.get_weights(), fitted.get_weights()))

    out = tmp_path / "run"
    run.train_run(config, str(out), progress=False, log=_quiet)
    privacy = json.loads((out / "privacy.json").read_text())
    journal = json.loads((out / "ledger.json").read_text())
    assert journal["entries"][0] == {"step": 0, "round": run.WARM_START_ROUND, "queries": 1}
    topagg_queries = sum(e["queries"] for e in journal["entries"][1:])
    assert privacy["queries"] == topagg_queries + 1
    z_vote = 5.0 / (2 * math.sqrt(30))
    mu = exact.composed_mu([(Z_MERF, 1), (z_vote, topagg_queries)])
    assert privacy["epsilon"]["epsilon"] == pytest.approx(exact.gaussian_epsilon(mu, 1e-5),
                                                          rel=1e-9)
    assert privacy["warm_start"]["spends"] == [{"noise_multiplier": Z_MERF, "count": 1}]


def test_a_crash_and_resume_keep_the_release_counted_once(merf_run, tiny_fmnist_dir,
                                                           tmp_path):
    config = datalens_config(tiny_fmnist_dir, str(merf_run))
    straight = tmp_path / "straight"
    run.train_run(config, str(straight), progress=False, log=_quiet, checkpoint_every=1)
    for point, step in (("after_spend", 0), ("after_checkpoint", 2)):
        out = tmp_path / f"crashed-{point}"
        with pytest.raises(Crash):
            run.train_run(config, str(out), progress=False, log=_quiet, checkpoint_every=1,
                          fault_hook=crash_at(point, step))
        run.train_run(config, str(out), progress=False, log=_quiet, checkpoint_every=1)
        journal = json.loads((out / "ledger.json").read_text())
        warm = [e for e in journal["entries"] if e["round"] == run.WARM_START_ROUND]
        assert warm == [{"step": 0, "round": -1, "queries": 1}]
        privacy = json.loads((out / "privacy.json").read_text())
        assert {"noise_multiplier": Z_MERF, "count": 1} in privacy["ledger"]["spends"]
        lost_rounds = [spend["round"] for item in privacy["lost_spends"]
                       for spend in item["spends"]]
        assert run.WARM_START_ROUND not in lost_rounds      # its release is not lost
        if point == "after_spend":
            assert lost_rounds == [0]                       # step 0's vote was
        if point == "after_checkpoint":          # nothing lost: the same run
            np.testing.assert_array_equal(np.load(out / "samples.npz")["x"],
                                          np.load(straight / "samples.npz")["x"])


def test_a_journal_that_lost_its_first_append_spends_the_release_on_resume(
        merf_run, tiny_fmnist_dir, tmp_path, monkeypatch):
    """The journal's first append (the warm start's round -1) fails (a full disk, a kill):
    the journal on disk is the empty one create_run_files wrote.  The resume counts the
    release then, before any TopAgg spend, exactly once."""
    config = datalens_config(tiny_fmnist_dir, str(merf_run))
    out = tmp_path / "run"
    append = run.PrivacyJournal.append

    def fail_first(journal, step, round_index, queries):
        if round_index == run.WARM_START_ROUND:
            raise OSError(28, "No space left on device")
        return append(journal, step, round_index, queries)

    with monkeypatch.context() as patch:
        patch.setattr(run.PrivacyJournal, "append", fail_first)
        with pytest.raises(OSError):
            run.train_run(config, str(out), progress=False, log=_quiet)
    assert json.loads((out / "ledger.json").read_text())["entries"] == []
    run.train_run(config, str(out), progress=False, log=_quiet)
    journal = json.loads((out / "ledger.json").read_text())
    assert journal["entries"][0] == {"step": 0, "round": run.WARM_START_ROUND, "queries": 1}
    assert [e["round"] for e in journal["entries"]].count(run.WARM_START_ROUND) == 1
    spends = json.loads((out / "privacy.json").read_text())["ledger"]["spends"]
    assert {"noise_multiplier": Z_MERF, "count": 1} in spends


def test_a_journal_with_spends_but_no_warm_start_is_refused(merf_run, tiny_fmnist_dir):
    class Lens:
        warm_start = warm_start.open_warm_start(
            str(merf_run), datalens_config(tiny_fmnist_dir, str(merf_run)).train)
        ledger = accounting.PrivacyLedger(delta=1e-5, conversion=accounting.Conversion.PLD)

    lens = Lens()
    lens.ledger.spend(dp_accounting.GaussianDpEvent(1.0))
    journal = run.PrivacyJournal("unused-ledger.json", lens.ledger)
    journal.entries.append(run_journal.Spend(0, 0, 1))
    config = datalens_config(tiny_fmnist_dir, str(merf_run))
    with pytest.raises(run.RunDirError, match="not the warm start's .*cannot be resumed"):
        run._journal_warm_start(lens, journal, config, _quiet)
    journal.entries[0] = run_journal.Spend(0, run.WARM_START_ROUND, 2)
    with pytest.raises(run.RunDirError, match="journals 2 warm-start queries but .* spent 1"):
        run._journal_warm_start(lens, journal, config, _quiet)


def test_a_resume_refuses_a_dp_merf_run_changed_since_the_start(merf_run, tiny_fmnist_dir,
                                                                tmp_path):
    """The DP-MERF folder is fingerprinted in config.json when the run begins; rerun in
    place (another release, another generator) it is refused on resume, by name."""
    source = tmp_path / "merf"
    shutil.copytree(merf_run, source)
    config = datalens_config(tiny_fmnist_dir, str(source))
    out = tmp_path / "run"
    with pytest.raises(Crash):
        run.train_run(config, str(out), progress=False, log=_quiet,
                      fault_hook=crash_at("after_spend", 0))
    recorded = json.loads((out / "config.json").read_text())["warm_start"]
    assert set(recorded["sha256"]) == {"release.npz", "generator.keras"}
    assert recorded["spends"] == [{"noise_multiplier": Z_MERF, "count": 1}]
    original = (source / "release.npz").read_bytes()
    release = dict(np.load(source / "release.npz"))
    np.savez(source / "release.npz", **{**release, "noisy_sum": release["noisy_sum"] + 1})
    with pytest.raises(run.RunDirError, match="has changed since this run started"):
        run.train_run(config, str(out), progress=False, log=_quiet)
    (source / "release.npz").write_bytes(original)        # put back: resumes
    run.train_run(config, str(out), progress=False, log=_quiet)
    assert (out / "privacy.json").exists()


def test_the_budget_plans_the_steps_the_release_leaves(merf_run, tiny_fmnist_dir):
    """Noise multiplier 50 / (2 sqrt(30)) per query, 4 queries a step: the release (mu^2
    0.25) costs more than a step (mu^2 0.19), so at epsilon 10 one step fewer fits."""
    changes = dict(budget={"max_eps": 10.0}, topagg={"sigma": 50.0})
    cold = datalens_config(tiny_fmnist_dir, None).replace(**changes)
    warm = datalens_config(tiny_fmnist_dir, str(merf_run)).replace(**changes)
    cold_steps = budget.steps_within_budget(cold, 4, 784)
    warm_steps = budget.steps_within_budget(warm, 4, 784)
    assert 0 < warm_steps < cold_steps
    expected = accounting.max_steps_within(
        sigma=50.0, topk=30, queries_per_step=4, max_eps=10.0, delta=1e-5,
        conversion=accounting.Conversion.PLD,
        prior=[mechanism.event(Z_MERF)])
    assert warm_steps == expected


def test_what_cannot_warm_start_is_refused_by_name(merf_run, tiny_fmnist_dir, tmp_path):
    def refused(match, path=str(merf_run), **train):
        config = datalens_config(tiny_fmnist_dir, path, **train)
        with pytest.raises(warm_start.WarmStartError, match=match):
            warm_start.open_warm_start(config.train.warm_start, config.train)

    refused("max_records = 40 but this run max_records = 30", max_records=30)
    refused("z_dim = 8 but this run z_dim = 9", z_dim=9)
    refused("generator_filters = 8 but this run generator_filters = 16.*rerun "
            "scripts/merf.py with --gf_dim 16", generator_filters=16)
    refused("max_records = 40 but this run max_records = None.*without --max_records",
            max_records=None)
    parsed = merf_cli.config_from_args(merf_cli.build_parser().parse_args(
        ["--run_dir", "x", "--gf_dim", "16", "--gfc_dim", "32"]))
    assert (parsed.generator_filters, parsed.generator_dense) == (16, 32)
    refused("was seeded .*seed this run too", seed=None)
    refused("config.json is missing", path=str(tmp_path / "nowhere"))
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"kind": "dpsgd", "config": {}}))
    refused("a 'dpsgd' run, not a DP-MERF run", path=str(other))
    unfinished = tmp_path / "unfinished"
    merf_train.train_merf(merf_config(tiny_fmnist_dir, fit_steps=1), str(unfinished),
                          log=_quiet)
    os.remove(unfinished / "report.json")
    refused("not finished", path=str(unfinished))
    out = tmp_path / "never"
    with pytest.raises(warm_start.WarmStartError):
        run.train_run(datalens_config(tiny_fmnist_dir, str(merf_run), max_records=30),
                      str(out), progress=False, log=_quiet)
    assert not out.exists()


def test_the_clis_and_resume_know_the_warm_start(merf_run):
    args = main_cli.build_parser().parse_args(["--dataset", "fashion_mnist",
                                               "--warm_start", str(merf_run)])
    assert main_cli.resolve(args)[1].train.warm_start == str(merf_run)
    parsed = reproduce_cli.build_parser().parse_args(
        ["fashion_mnist", "--eps", "1", "--warm_start", str(merf_run)])
    assert parsed.warm_start == str(merf_run)
    options = paper_rows.ReproduceOptions("fashion_mnist", 1, warm_start=str(merf_run))
    assert options.default_name() == "fashion_mnist-eps1-warm"
    config, deviations = paper_rows.build_config(options)
    assert config.train.warm_start == str(merf_run)
    assert len(deviations) == 1 and "DP-MERF run" in deviations[0]
    saved = datalens_config("d", "a").to_dict()
    assert resume.resume_differences(saved, datalens_config("d", "b")) == [
        ("train.warm_start", "a", "b")]
    assert "train.warm_start" in resume.PRIVACY_RELEVANT
    old = datalens_config("d", None).to_dict()
    del old["train"]["warm_start"]              # a run from before the option resumes
    assert resume.resume_differences(old, datalens_config("d", None)) == []


# ------------------------------------------------------------------ results/beyond

def _write(path, record):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def test_the_beyond_readme_groups_merf_runs_over_seeds_and_shows_the_screen(tmp_path):
    from dclens.experiments import beyond
    for seed, (val, sen, agreement, fid, eps) in enumerate(
            [(0.70, 0.72, 0.6, 50.0, 0.9990), (0.80, 0.82, 0.8, 60.0, 0.9995)], start=1):
        folder = tmp_path / "merf" / f"fashion_mnist-merf-eps1-private-lr3e-5-seed{seed}"
        _write(folder / "evaluation.json", {
            "protocols": {"val": {"accuracy": val}, "sen": {"accuracy": sen}},
            "quality": {"label_agreement": agreement, "fid": fid}})
        _write(folder / "privacy.json", {"epsilon": {"epsilon": eps}, "conversion": "pld",
                                         "training_records": "private"})
    _write(tmp_path / "rescored" / "warm-start" / "summary.json", {"rows": [
        {"schedule": {"learning_rate": 3e-5}, "val": [0.68, 0.70]},
        {"schedule": {"learning_rate": 1e-3}, "val": [0.1]}]})
    (row,) = beyond.merf_rows(str(tmp_path))
    assert row["name"] == "fashion_mnist-merf-eps1-private-lr3e-5" and row["runs"] == 2
    assert row["val"][1] == pytest.approx(0.75) and row["val"][2] == pytest.approx(0.0707107)
    assert row["epsilon"] == 0.9995 and row["eps"] == 1
    readme = beyond.render(str(tmp_path / "no-results"), str(tmp_path))
    assert ("| DP-MERF alone (`fashion_mnist-merf-eps1-private-lr3e-5`, [below](#dp-merf-"
            "alone-and-as-datalens-warm-start)) | 1 | 2 | 0.7500 +- 0.0707 (2 runs) |") in readme
    text = "\n".join(beyond._merf_lines(str(tmp_path), 3e-5))
    assert ("| `fashion_mnist-merf-eps1-private-lr3e-5` | 2 | 0.7500 +- 0.0707 (2 runs) | "
            "0.7700 +- 0.0707 (2 runs) | 0.700 +- 0.141 (2 runs) | 55.0 +- 7.1 (2 runs) | "
            "1.000 | pld | private |") in text
    assert f"| {beyond.MERF_SCREEN_GROUPS['warm-start']} | 0.690 +- 0.014 (2 runs) |" in text
    assert beyond._merf_lines(str(tmp_path / "empty"), 3e-5) == []
