"""GS-WGAN (dclens/gswgan): the sanitizer exactly with noise off and statistically with
noise on, its sensitivity under an adversarial change of the discriminator, the plain
autodiff update at sigma = 0 and C = inf, shard isolation of the warm-start (one shard
swapped adversarially changes only its own discriminator), the accounting against the
fact sheet's hand-computed values, and a tiny end-to-end run that is killed and resumed
without under-counting."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import tensorflow as tf

from dclens.runs import journal
from dclens.gswgan import accounting as gs_accounting
from dclens.gswgan import discriminators, models, steps, train
from dclens.gswgan.accounting import Accounting
from dclens.gswgan.config import GswganConfig, GswganConfigError
from dclens.common.rng import SeedTree
from conftest import load_script


def _tiny_config(data_dir, **changes) -> GswganConfig:
    values = dict(data_dir=str(data_dir), num_discriminators=4, model_dim=2, batch_size=6,
                  critic_iters=1, warm_iterations=1, iterations=6, warm_chunk=1,
                  checkpoint_every=3, log_every=2, num_samples=20, seed=3,
                  target_eps=None, sigma=1.0)
    values.update(changes)
    return GswganConfig(**values)


def _pair(model_dim=2, seed=0):
    config = GswganConfig(model_dim=model_dim)
    seeds = SeedTree(seed)
    return (discriminators.new_generator(config, 10, seeds, 2, 0),
            discriminators.new_discriminator(config, 10, seeds, 0))


# ------------------------------------------------------------------ sanitizer

def test_sanitize_without_noise_is_exactly_the_per_sample_clip():
    rng = np.random.default_rng(0)
    gradients = rng.normal(size=(7, 28, 28, 1)).astype(np.float32)
    gradients[2] *= 1e-3                         # a row inside the ball stays as it is
    clip = 3.0
    out = steps.sanitize(tf.constant(gradients), clip=clip, sigma=0.0, noise=None).numpy()
    for row, original in zip(out, gradients):    # slow reference, one row at a time
        norm = math.sqrt(float(np.sum(original.astype(np.float64) ** 2)))
        expected = original * min(1.0, clip / (norm + 1e-10))
        np.testing.assert_allclose(row, expected, rtol=1e-6, atol=1e-7)
    norms = np.sqrt(np.sum(out.reshape(7, -1) ** 2, axis=1))
    assert np.all(norms <= clip * (1 + 1e-6))
    np.testing.assert_allclose(out[2], gradients[2], rtol=1e-6)


def test_sanitize_noise_has_std_two_c_sigma():
    """std of the added noise is SENSITIVITY * C * sigma = 2 C sigma.  With 200,704 draws
    the relative standard error of the sample std is 1/sqrt(2n) = 0.16%; tolerance 1%."""
    clip, sigma = 0.5, 1.7
    noise = tf.random.stateless_normal((256, 28, 28, 1), seed=[1, 2])
    out = steps.sanitize(tf.zeros((256, 28, 28, 1)), clip=clip, sigma=sigma, noise=noise)
    assert np.std(out.numpy()) == pytest.approx(2 * clip * sigma, rel=0.01)
    assert abs(np.mean(out.numpy())) < 0.01 * 2 * clip * sigma
    with pytest.raises(ValueError, match="finite clip"):
        steps.sanitize(tf.zeros((2, 3)), clip=math.inf, sigma=1.0, noise=tf.zeros((2, 3)))


def test_sanitize_zeroes_rows_that_are_not_finite():
    """A NaN or infinite gradient row has no finite norm, so scaling cannot bound it: it
    is released as zeros (plus noise), and every other row as usual."""
    gradients = np.ones((4, 28, 28, 1), np.float32)
    gradients[1, 3, 4, 0] = np.nan
    gradients[2, 0, 0, 0] = np.inf
    out = steps.sanitize(tf.constant(gradients), clip=0.5, sigma=0.0, noise=None).numpy()
    assert np.all(out[1] == 0) and np.all(out[2] == 0)
    np.testing.assert_allclose(out[0], gradients[0] * 0.5 / 28.0, rtol=1e-5)
    noise = tf.random.stateless_normal((4, 28, 28, 1), seed=[3, 4])
    noisy = steps.sanitize(tf.constant(gradients), clip=0.5, sigma=2.0, noise=noise).numpy()
    np.testing.assert_allclose(noisy[1], 2 * 0.5 * 2.0 * noise.numpy()[1], rtol=1e-6)
    assert np.all(np.isfinite(noisy))


def test_release_changes_by_at_most_two_c_when_the_discriminator_is_replaced():
    """The mechanism's sensitivity by construction: the same fakes, sigma = 0, and an
    adversarial other discriminator (other weights, scaled up 50x so its gradients are
    huge): every released row moves by at most 2C in L2."""
    generator, discriminator = _pair()
    _, adversary = _pair(seed=9)
    adversary.set_weights([50 * w for w in adversary.get_weights()])
    z = steps.bernoulli_latent(tf.constant([1, 1], tf.int64), 12, 10)
    y = tf.range(12, dtype=tf.int64) % 10
    clip = 0.25
    weights = generator.get_weights()
    _, release = steps.private_generator_gradients(generator, discriminator, z, y,
                                                   clip=clip, sigma=0.0, noise=None)
    generator.set_weights(weights)               # the same fakes: its u moved in the call
    _, other = steps.private_generator_gradients(generator, adversary, z, y, clip=clip,
                                                 sigma=0.0, noise=None)
    change = np.sqrt(np.sum((release.numpy() - other.numpy()).reshape(12, -1) ** 2, axis=1))
    assert np.all(change <= steps.SENSITIVITY * clip * (1 + 1e-5))
    assert np.max(change) > clip        # the bound is not vacuous here: rows do move


def test_sigma_zero_and_no_clip_give_the_plain_autodiff_update():
    generator, discriminator = _pair()
    z = steps.bernoulli_latent(tf.constant([3, 4], tf.int64), 5, 10)
    y = tf.constant([0, 3, 3, 9, 1], tf.int64)
    state = (generator.get_weights(), discriminator.get_weights())
    private, _ = steps.private_generator_gradients(generator, discriminator, z, y,
                                                   clip=math.inf, sigma=0.0, noise=None)
    generator.set_weights(state[0])              # the power iterations moved u: restore
    discriminator.set_weights(state[1])
    plain = steps.plain_generator_gradients(generator, discriminator, z, y)
    for a, b in zip(private, plain):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-7)


def test_the_generator_sees_the_discriminator_only_through_the_release(monkeypatch):
    """With the sanitizer replaced by a fixed release R, the generator's gradient is
    J_G^T R / B -- the gradient of sum_j <G(z_j), R_j> / B, computed here directly -- and
    the same for two different discriminators; and row j of the per-image gradient is
    that of image j alone (a batch of one)."""
    generator, discriminator = _pair()
    _, adversary = _pair(seed=9)
    z = steps.bernoulli_latent(tf.constant([5, 6], tf.int64), 6, 10)
    y = tf.constant([0, 1, 2, 7, 8, 9], tf.int64)
    fixed = tf.random.stateless_normal((6, 28, 28, 1), seed=[7, 8])
    weights = generator.get_weights()
    monkeypatch.setattr(steps, "sanitize", lambda per_sample, **_: fixed)
    results = []
    for critic in (discriminator, adversary):
        generator.set_weights(weights)
        gradients, released = steps.private_generator_gradients(
            generator, critic, z, y, clip=1.0, sigma=1.0, noise=None)
        assert released is fixed
        results.append(gradients)
    generator.set_weights(weights)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(generator(z, y, training=True) * fixed) / 6.0
    reference = tape.gradient(loss, generator.trainable_variables)
    for ours, theirs, direct in zip(*results, reference):
        np.testing.assert_allclose(ours.numpy(), direct.numpy(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(theirs.numpy(), direct.numpy(), rtol=1e-4, atol=1e-6)
    monkeypatch.undo()
    generator.set_weights(weights)
    fakes = generator(z, y, training=False)
    state = discriminator.get_weights()

    def per_image(images, labels):
        discriminator.set_weights(state)         # the power iteration moves u per call
        with tf.GradientTape() as image_tape:
            image_tape.watch(images)
            total = -tf.reduce_sum(discriminator(images, labels, training=True))
        return image_tape.gradient(total, images).numpy()
    batch = per_image(fakes, y)
    for j in range(6):
        np.testing.assert_allclose(batch[j], per_image(fakes[j:j + 1], y[j:j + 1])[0],
                                   rtol=1e-4, atol=1e-7)


# ------------------------------------------------------------------ networks

def test_networks_have_the_paper_shapes_and_independent_layer_seeds():
    generator, discriminator = _pair(model_dim=4)
    images = generator(tf.zeros((3, 10)), tf.constant([0, 1, 2], tf.int64))
    assert images.shape == (3, 28, 28, 1)
    assert float(tf.reduce_min(images)) >= 0 and float(tf.reduce_max(images)) <= 1
    assert discriminator(images, tf.constant([0, 1, 2], tf.int64)).shape == (3,)
    kernels = [w for w in generator.trainable_weights if "kernel" in w.path]
    block_convs = [k.numpy() for k in kernels if tuple(k.shape) == (3, 3, 16, 16)]
    assert len(block_convs) == 6
    # one independent seed per layer: no two same-shaped kernels start equal
    assert all(not np.allclose(a, b) for i, a in enumerate(block_convs)
               for b in block_convs[i + 1:])


def test_spectral_norm_bounds_the_largest_singular_value():
    """After enough training calls the power iteration converges: the normalised dense
    kernel has spectral norm 1 (within 1%)."""
    layer = models.SNDense(5, seed=4)
    layer.build((None, 7))
    layer.kernel.assign(10 * layer.kernel)
    for _ in range(50):
        normalized = layer.normalized(layer.kernel, training=True)
    assert np.linalg.svd(normalized.numpy(), compute_uv=False)[0] == pytest.approx(1, rel=0.01)


# ------------------------------------------------------------------ shards, warm-start

def test_shards_are_disjoint(tiny_fmnist_dir):
    config = _tiny_config(tiny_fmnist_dir, num_discriminators=7)
    labels = np.arange(120) % 10
    shards = train.shard_indices(labels, config, SeedTree(1), 10)
    assert shards.shape == (7, 120 // 7)
    assert len(np.unique(shards)) == shards.size and shards.max() < 120
    with pytest.raises(GswganConfigError, match="exceeds the 120 training records"):
        train.shard_indices(labels, _tiny_config(tiny_fmnist_dir, num_discriminators=121),
                            SeedTree(1), 10)


def test_warm_start_of_a_discriminator_sees_only_its_own_shard(tmp_path):
    """Swap shard 1's records adversarially (all pixels 1, labels changed): after the
    warm-start, discriminator 1 differs and discriminators 0 and 2 -- one trained in the
    same graph as 1 -- are bit-identical.  Chunks of 1 give the same discriminators."""
    config = GswganConfig(num_discriminators=3, model_dim=2, batch_size=4, critic_iters=1,
                          warm_iterations=2, warm_chunk=2, seed=0)
    rng = np.random.default_rng(0)
    images = rng.uniform(size=(30, 28, 28, 1)).astype(np.float32)
    labels = (np.arange(30) % 10).astype(np.int64)
    seeds = SeedTree(5)
    shards = train.shard_indices(labels, config, seeds, 10)
    swapped_images, swapped_labels = images.copy(), labels.copy()
    swapped_images[shards[1]] = 1.0
    swapped_labels[shards[1]] = (labels[shards[1]] + 3) % 10
    rows = []
    cases = ((images, labels, config), (swapped_images, swapped_labels, config),
             (images, labels, dataclasses.replace(config, warm_chunk=1)))
    for index, (x, y, case_config) in enumerate(cases):
        _, discriminator = _pair()
        bank = discriminators.DiscriminatorBank(str(tmp_path / f"bank{index}.npy"), discriminator,
                                       discriminators.adam_for(config, discriminator), 3, create=True)
        discriminators.warm_start(case_config, bank, x, y, shards, seeds, 10,
                         str(tmp_path / f"warm{index}.json"), log=lambda line: None,
                         bar_enabled=False, hook=train._no_hook)
        rows.append(np.array(bank.rows))
    assert np.array_equal(rows[0][0], rows[1][0]) and np.array_equal(rows[0][2], rows[1][2])
    assert not np.array_equal(rows[0][1], rows[1][1])
    # Training pairs together (one graph, reused across chunks) or one at a time gives
    # the same discriminators: every member's draws are keyed by the member.
    np.testing.assert_allclose(rows[2], rows[0], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ accounting

def test_accounting_matches_the_fact_sheet_values():
    """Computed with dp_accounting (docs/gswgan.md, Privacy): sigma 1.07, T 20000, B 32, N_D 1000, delta 1e-5 gives
    9.99 (classic conversion) and 9.24 (dp_accounting's) per sample; the provable
    iteration-level accounting needs sigma 2.87 for 10 and 7.56 for 1."""
    common = dict(num_discriminators=1000, batch_size=32, iterations=20000, delta=1e-5)
    per_sample = Accounting.PER_SAMPLE_PAPER
    assert gs_accounting.epsilon(accounting=per_sample, sigma=1.07, conversion="classic",
                                 **common) == pytest.approx(9.99, abs=0.01)
    assert gs_accounting.epsilon(accounting=per_sample, sigma=1.07,
                                 **common) == pytest.approx(9.24, abs=0.01)
    assert gs_accounting.epsilon(accounting=Accounting.ITERATION, sigma=2.87,
                                 **common) == pytest.approx(10.0, abs=0.05)
    assert gs_accounting.epsilon(accounting=Accounting.ITERATION, sigma=7.56,
                                 **common) == pytest.approx(1.0, abs=0.01)
    assert Accounting.ITERATION.proven and not per_sample.proven


def test_iteration_event_is_one_sampled_gaussian_of_sigma_over_sqrt_b():
    import dp_accounting

    event = Accounting.ITERATION.iteration_event(sigma=2.0, num_discriminators=50,
                                                 batch_size=16)
    direct = dp_accounting.SampledWithoutReplacementDpEvent(
        50, 1, dp_accounting.GaussianDpEvent(2.0 / 4.0))
    values = []
    for e in (event, direct):
        account = dp_accounting.rdp.RdpAccountant(
            neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        account.compose(dp_accounting.SelfComposedDpEvent(e, 100))
        values.append(account.get_epsilon(1e-5))
    assert values[0] == pytest.approx(values[1], rel=1e-9)


def test_calibrated_sigma_meets_the_target_tightly():
    common = dict(num_discriminators=100, batch_size=8, iterations=300, delta=1e-5)
    for accounting in Accounting:
        sigma = gs_accounting.calibrate_sigma(accounting=accounting, target_epsilon=3.0,
                                              **common)
        assert gs_accounting.epsilon(accounting=accounting, sigma=sigma, **common) <= 3.0
        assert gs_accounting.epsilon(accounting=accounting, sigma=sigma / 1.01,
                                     **common) > 3.0


# ------------------------------------------------------------------ end to end

class _Killed(Exception):
    pass


def test_a_killed_run_resumes_without_under_counting(tiny_fmnist_dir, tmp_path):
    """Killed after journaling iteration index 4 (checkpoint at 3): iterations 3 and 4 stay
    spent; the resumed run redoes them and its journal holds 2 spends more than an
    uninterrupted run's 6.  Outputs: samples, report naming the accounting, the journal.
    (A real kill -9: tests/test_faults.py.)"""
    config = _tiny_config(tiny_fmnist_dir)

    def kill(point, value):
        if point == "after_spend" and value == 4:
            raise _Killed
    with pytest.raises(_Killed):
        train.train_gswgan(config, str(tmp_path / "run"), progress=False,
                           log=lambda line: None, hook=kill)
    killed = journal.PrivacyJournal.load(tmp_path / "run" / "ledger.json")
    assert killed.queries == 5                        # iterations 0..4, journaled
    lines = []
    resumed = train.train_gswgan(config, str(tmp_path / "run"), progress=False,
                                 log=lines.append)
    assert any("resuming at iteration 3" in line and "2 iterations" in line for line in lines)
    privacy = resumed["privacy"]
    assert privacy["iterations_spent"] == 8 and privacy["lost_iterations"] == 2
    # epsilon is that of all 8 spends (6 iterations + 2 lost), not of the 6 kept
    common = dict(accounting=Accounting.ITERATION, sigma=1.0, num_discriminators=4,
                  batch_size=6, delta=1e-5)
    assert privacy["epsilon"]["epsilon"] == pytest.approx(
        gs_accounting.epsilon(iterations=8, **common), rel=1e-12)
    assert privacy["epsilon"]["epsilon"] > gs_accounting.epsilon(iterations=6, **common)
    assert privacy["accounting"] == "iteration" and privacy["accounting_proven"] is True
    assert "not covered by epsilon" in privacy["hyperparameter_selection"]
    assert privacy["critic_updates"] == "discard"
    assert privacy["for_comparison"]["accounting"] == "per_sample_paper"
    assert privacy["for_comparison"]["proven"] is False
    with np.load(tmp_path / "run" / "samples.npz") as saved:
        assert saved["x"].shape == (20, 28, 28, 1) and saved["y"].shape == (20,)
    with open(tmp_path / "run" / "report.json") as stream:
        assert json.load(stream)["method"] == "gswgan"


@pytest.mark.parametrize("critic_updates", ["discard", "keep"])
def test_discarded_critic_updates_leave_the_bank_as_the_warm_start_left_it(
        tiny_fmnist_dir, tmp_path, critic_updates):
    """The proof's condition: with discard (default) the DP phase never writes the bank,
    so each iteration's discriminator is its warm-start state, a function of its shard
    alone; keep (the released code) writes it back and makes the run unproven under
    either accounting.  The bank is snapshotted when the warm-start's last chunk is done."""
    config = _tiny_config(tiny_fmnist_dir, critic_updates=critic_updates)
    snapshots = []

    def snapshot(point, value):
        if point == "after_warm_chunk" and value == config.num_discriminators:
            snapshots.append(np.load(tmp_path / "run" / "discriminators.npy").copy())
    report = train.train_gswgan(config, str(tmp_path / "run"), progress=False,
                                log=lambda line: None, hook=snapshot)
    after = np.load(tmp_path / "run" / "discriminators.npy")
    assert len(snapshots) == 1
    privacy = report["privacy"]
    assert privacy["critic_updates"] == critic_updates
    if critic_updates == "discard":
        assert np.array_equal(after, snapshots[0])
        assert privacy["accounting_proven"] is True
    else:
        assert not np.array_equal(after, snapshots[0])      # the DP phase trained D_k
        assert privacy["accounting_proven"] is False
        assert privacy["for_comparison"]["proven"] is False


def test_a_run_from_before_critic_updates_existed_resumes_only_as_keep(tmp_path):
    """Runs made before the setting kept the critic updates: a saved config without it
    means keep, so resuming it under the new default (discard) is refused by name, in
    the words of scripts/gswgan.py's own option (--run_dir)."""
    from dclens.runs import rundir
    from dclens.gswgan.config import CHANGEABLE_ON_RESUME, IMPLIED_BY_OLDER_RUNS

    differences = rundir.differences_except(CHANGEABLE_ON_RESUME, IMPLIED_BY_OLDER_RUNS)
    saved = GswganConfig().to_dict()
    del saved["critic_updates"]
    assert differences(saved, GswganConfig()) == [("critic_updates", "keep", "discard")]
    assert differences(saved, GswganConfig(critic_updates="keep")) == []
    assert differences(GswganConfig().to_dict(), GswganConfig()) == []
    (tmp_path / "config.json").write_text(json.dumps({"config": saved}))
    with pytest.raises(rundir.RunDirError,
                       match="--run_dir .* critic_updates: saved 'keep', now 'discard'"):
        rundir.open_run(GswganConfig(), str(tmp_path), kind="gswgan", restart=False,
                        changeable=CHANGEABLE_ON_RESUME, log=lambda line: None,
                        implied=IMPLIED_BY_OLDER_RUNS)


def test_cli_stops_at_the_budget_and_marks_the_unproven_accounting(tiny_fmnist_dir,
                                                                    tmp_path, capsys):
    cli = load_script("gswgan")
    code = cli.main(["--run_dir", str(tmp_path / "run"), "--data_dir", str(tiny_fmnist_dir),
                     "--num_discriminators", "4", "--model_dim", "2", "--batch_size", "6",
                     "--critic_iters", "1", "--warm_iterations", "0", "--iterations", "4",
                     "--num_samples", "20", "--seed", "1", "--target_eps", "50",
                     "--accounting", "per_sample_paper", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0 and "per_sample_paper accounting, critic updates discard (NOT proven)" \
        in out
    with open(tmp_path / "run" / "report.json") as stream:
        privacy = json.load(stream)["privacy"]
    assert privacy["epsilon"]["epsilon"] <= 50.0 and privacy["accounting_proven"] is False
    # bad input: quoted by name, nothing written
    with pytest.raises(SystemExit):
        cli.main(["--run_dir", str(tmp_path / "bad"), "--num_discriminators", "0"])
    assert "num_discriminators = 0" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_progress_and_grid_show_only_released_values_and_their_caveats(
        tiny_fmnist_dir, tmp_path, capsys, monkeypatch):
    """The DP phase's bar shows epsilon and the released gradient norm, never the critic
    loss (computed on the drawn shard's private records, no noise); the grid's title and
    the TensorBoard epsilon curve name the accounting, and the title the seeded noise."""
    from dclens.common import export

    titles = []
    write = export.write_grid_png
    monkeypatch.setattr(export, "write_grid_png", lambda path, grid, *, title="", **kw: (
        titles.append(title), write(path, grid, title=title, **kw))[1])
    from dclens.common.progress import PlainProgress      # stderr is not a terminal here

    shown = []
    postfix = PlainProgress.set_postfix
    monkeypatch.setattr(PlainProgress, "set_postfix", lambda bar, *args, **fields: (
        shown.append((args, set(fields))), postfix(bar, *args, **fields))[1])
    config = _tiny_config(tiny_fmnist_dir, accounting="per_sample_paper")
    train.train_gswgan(config, str(tmp_path / "run"), progress=True, log=lambda line: None)
    err = capsys.readouterr().err
    assert "eps=" in err and "norm=" in err          # the bar was drawn, with its fields
    assert shown and all(entry == ((), {"eps", "norm"}) for entry in shown)
    assert titles == [titles[0]] and "NOT a proven guarantee" in titles[0]
    assert "seeded noise: NOT private" in titles[0]
    assert "(per_sample_paper accounting, critic updates discard)" in titles[0]
    tags = {value.tag for path in (tmp_path / "run" / "logs").rglob("events.out.*")
            for event in tf.compat.v1.train.summary_iterator(str(path))
            for value in event.summary.value}
    assert "gswgan/epsilon_per_sample_paper_critic_discard_NOT_proven" in tags
    assert "gswgan/epsilon" not in tags and "gswgan/released_norm" in tags


def test_privacy_cli_calibrates_gswgan_under_both_accountings(capsys):
    cli = load_script("privacy")
    assert cli.main(["gswgan", "--target_eps", "10", "--iterations", "2000",
                     "--num_discriminators", "100", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert set(results) == {"iteration", "per_sample_paper"}
    assert all(r["epsilon"] <= 10 for r in results.values())
    # the provable accounting needs more noise for the same budget
    assert results["iteration"]["sigma"] > results["per_sample_paper"]["sigma"]
    assert results["per_sample_paper"]["proven"] is False


def test_settings_are_checked_by_name():
    with pytest.raises(GswganConfigError, match="give exactly one of target_eps"):
        GswganConfig(sigma=1.0)
    with pytest.raises(GswganConfigError, match="accounting = 'magic'"):
        GswganConfig(accounting="magic")
    with pytest.raises(GswganConfigError, match="dataset = 'celebA-gender'"):
        GswganConfig(dataset="celebA-gender")
    with pytest.raises(GswganConfigError, match="batch_size = 0"):
        GswganConfig(batch_size=0)
