"""The generator's moving average (``train.generator_ema``, issue 39's lever 2): the exact
recurrence, what it changes (the samples and the published generator, not the training or
the ledger), its survival across a crash, and its off state (the default) changing nothing."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

from dclens.datalens import outputs, run
from dclens.datalens.config import ConfigError, TrainConfig
from dclens.datalens.sample import generator_function, sample_generator
from dclens.datalens.train import DataLens
from dclens import data
from test_end_to_end import tiny_config
from test_resume import Crash, crash_at

DECAY = 0.6
STEPS = 4


def _config(data_dir, decay):
    config = tiny_config(data_dir, steps=STEPS)
    return config.replace(train={"generator_ema": decay})


def test_the_average_follows_its_recurrence_exactly(tiny_fmnist_dir):
    """w_ema <- d w_ema + (1 - d) w after every student update, from the initial weights,
    recomputed in float32 numpy from the student's weights after each step (g_step 1)."""
    config = _config(tiny_fmnist_dir, DECAY)
    dataset = data.load_dataset("fashion_mnist", str(tiny_fmnist_dir),
                                limit=config.train.max_records, progress=False)
    lens = DataLens(config, dataset, root_seed=1)
    expected = [w.numpy().copy() for w in lens.generator.trainable_variables]
    for _ in range(3):
        lens.train_step()
        decay = np.float32(DECAY)
        expected = [decay * e + (np.float32(1) - decay) * w.numpy()
                    for e, w in zip(expected, lens.generator.trainable_variables)]
    for got, want in zip(lens.generator_average, expected):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7)
    # The average is not the student (they moved apart), and the samples come from it.
    assert not all(np.array_equal(a.numpy(), w.numpy()) for a, w in
                   zip(lens.generator_average, lens.generator.trainable_variables))
    released = lens.released_generator()
    for variable, average in zip(released.trainable_variables, lens.generator_average):
        np.testing.assert_array_equal(variable.numpy(), average.numpy())
    images, labels = lens.sample(12)
    again, _ = sample_generator(generator_function(released), lens.shape,
                                config.train.z_dim, 12, seeds=lens.seeds, batch=lens.batch)
    np.testing.assert_allclose(images, again, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def runs(tiny_fmnist_dir, tmp_path_factory):
    """Two seeded runs, without and with the average, else identical."""
    root = tmp_path_factory.mktemp("ema")
    outputs = {}
    for decay in (0.0, DECAY):
        out = root / f"decay-{decay}"
        run.train_run(_config(tiny_fmnist_dir, decay), str(out), progress=False,
                      log=lambda _: None, checkpoint_every=1)
        outputs[decay] = out
    return outputs


def test_the_average_changes_the_samples_but_not_the_training_or_the_ledger(runs):
    plain, averaged = runs[0.0], runs[DECAY]
    privacy = [json.loads((out / "privacy.json").read_text()) for out in (plain, averaged)]
    assert privacy[0]["ledger"] == privacy[1]["ledger"]
    assert privacy[0]["epsilon_per_step"] == privacy[1]["epsilon_per_step"]
    samples = [np.load(out / "samples.npz")["x"] for out in (plain, averaged)]
    assert not np.array_equal(samples[0], samples[1])
    # The published generators differ (the average, the student); sampling the averaged
    # run's published model again gives its published samples.
    models = [keras.models.load_model(out / "generator.keras") for out in (plain, averaged)]
    assert any(not np.array_equal(a.numpy(), b.numpy()) for a, b in
               zip(models[0].trainable_variables, models[1].trainable_variables))
    resampled = outputs.sample_run(str(averaged), seed=_config(None, DECAY).train.seed,
                               log=lambda _: None)
    np.testing.assert_array_equal(np.load(resampled["samples"])["x"], samples[1])


def test_a_crashed_run_with_the_average_resumes_bit_identically(runs, tiny_fmnist_dir,
                                                                 tmp_path):
    out = tmp_path / "run"
    with pytest.raises(Crash):
        run.train_run(_config(tiny_fmnist_dir, DECAY), str(out), progress=False,
                      log=lambda _: None, checkpoint_every=1,
                      fault_hook=crash_at("after_checkpoint", 2))
    summary = run.train_run(_config(tiny_fmnist_dir, DECAY), str(out), progress=False,
                            log=lambda _: None, checkpoint_every=1)
    assert summary.resumed_from_step == 2
    np.testing.assert_array_equal(np.load(out / "samples.npz")["x"],
                                  np.load(runs[DECAY] / "samples.npz")["x"])


def test_off_is_the_student_itself(tiny_fmnist_dir):
    config = _config(tiny_fmnist_dir, 0.0)
    lens = DataLens(config, data.load_dataset("fashion_mnist", str(tiny_fmnist_dir),
                                              limit=config.train.max_records, progress=False),
                    root_seed=1)
    assert lens.generator_average is None
    assert lens.generate_released is lens.generate
    assert lens.released_generator() is lens.generator
    assert "average_000" not in lens.state_arrays()


@pytest.mark.parametrize("decay", [1.0, -0.1, float("nan"), "0.9"])
def test_a_decay_outside_zero_one_is_refused(decay):
    with pytest.raises(ConfigError, match="generator_ema must be a decay in"):
        TrainConfig(generator_ema=decay)
