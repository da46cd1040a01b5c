"""DPImageBench's protocol (dclens.evaluation.dpimagebench): its split, schedule, weight
average, selection, refusal of runs that saw the validation records, resume, and CLI."""

import dataclasses
import json

import numpy as np
import pytest
from conftest import band_images

from dclens import data
from dclens.data import splits
from dclens.evaluation import dpimagebench, evaluate
from dclens.evaluation import dpimagebench_networks as networks
from dclens.evaluation.synthetic_input import EvaluationError

TINY = dpimagebench.DPImageBenchProtocol(resnet_depth=8, generated_samples=240,
                                         train_samples=200, epochs=2, batch_size=64)


def test_the_defaults_are_dpimagebenchs_and_the_schedule_steps_every_20_epochs():
    protocol = dpimagebench.DPImageBenchProtocol()
    assert (protocol.resnet_depth, protocol.generated_samples, protocol.train_samples,
            protocol.epochs, protocol.batch_size, protocol.learning_rate) == (
                110, 60_000, 55_000, 50, 256, 0.01)
    assert protocol.follows_dpimagebench
    assert dataclasses.replace(protocol, resnet_depth=20).follows_dpimagebench
    assert not dataclasses.replace(protocol, epochs=49).follows_dpimagebench
    rates = [protocol.learning_rate_at(e) for e in (0, 19, 20, 39, 40, 49)]
    np.testing.assert_allclose(rates, [0.01, 0.01, 0.002, 0.002, 0.0004, 0.0004])


def test_the_classifier_trains_on_dpimagebenchs_fixed_shuffle_of_the_first_samples():
    protocol = dpimagebench.DPImageBenchProtocol()
    rows = dpimagebench.classifier_training_rows(70_000, protocol)
    expected = np.random.default_rng(0).permutation(60_000)[:55_000]
    np.testing.assert_array_equal(rows, expected)
    with pytest.raises(EvaluationError, match=r"reads 60000 samples; got 59999.*"
                                              r"--num_samples 60000"):
        dpimagebench.classifier_training_rows(59_999, protocol)


@pytest.mark.parametrize("records, refused", [("private", False), ("all", True),
                                              ("tuning", True)])
def test_a_run_that_read_a_validation_record_is_refused(records, refused):
    held = dpimagebench.validation_range(60_000)
    assert (held.start, held.stop) == (55_000, 60_000)
    trained = splits.record_range(60_000, records)
    assert bool(set(trained) & set(held)) == refused          # the rule, by brute force
    if refused:
        with pytest.raises(EvaluationError, match=f"{records!r} records.*--training_records "
                                                  "private"):
            dpimagebench.check_unseen(records, 60_000)
    else:
        dpimagebench.check_unseen(records, 60_000)


def test_selection_takes_the_latest_best_validation_epoch_and_only_the_validation_curve():
    assert dpimagebench.select_latest_best([0.2, 0.5, 0.4, 0.5, 0.1]) == 3
    assert dpimagebench.select_latest_best([0.9]) == 0
    with pytest.raises(EvaluationError):
        dpimagebench.select_latest_best([])
    with pytest.raises(EvaluationError):
        dpimagebench.select_latest_best([0.1, float("nan")])


def test_the_resnet_has_dpimagebenchs_shape_and_independent_initializers():
    model = networks.build_resnet((28, 28, 1), 10, depth=20, seed=3)
    convs = [layer for layer in model.layers if layer.__class__.__name__ == "Conv2D"]
    assert len(convs) == 1 + 6 * 3 + 2                    # stem, 2 per block, 2 shortcuts
    assert all(not layer.use_bias for layer in convs)
    shapes = {layer.name: tuple(layer.output.shape[1:3]) for layer in convs}
    assert shapes["layer1_0_conv1"] == (28, 28)
    assert shapes["layer2_0_conv1"] == shapes["layer2_0_down"] == (14, 14)
    assert shapes["layer3_0_conv1"] == (7, 7)
    assert model.output.shape[1:] == (10,)
    macs = (28 * 28 * 9 * 16 + 6 * 28 * 28 * 9 * 16 * 16
            + 14 * 14 * 9 * 16 * 32 + 5 * 14 * 14 * 9 * 32 * 32 + 14 * 14 * 16 * 32
            + 7 * 7 * 9 * 32 * 64 + 5 * 7 * 7 * 9 * 64 * 64 + 7 * 7 * 32 * 64 + 64 * 10)
    assert networks.forward_gflop(model) == pytest.approx(2 * macs / 1e9, rel=1e-12)
    # He-normal over fan-out: sd sqrt(2 / (9 * 64)) for a 64-filter 3x3 kernel (9 * 64 * 64
    # draws: the sample sd is within 3% of it).
    kernel = model.get_layer("layer3_1_conv1").kernel.numpy()
    assert abs(kernel.std() / np.sqrt(2 / (9 * 64)) - 1) < 0.03
    # Two layers of one shape draw different values (one key per layer).
    a = model.get_layer("layer3_1_conv1").kernel.numpy()
    b = model.get_layer("layer3_1_conv2").kernel.numpy()
    assert not np.allclose(a, b)
    again = networks.build_resnet((28, 28, 1), 10, depth=20, seed=3)
    for x, y in zip(model.weights, again.weights):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    with pytest.raises(EvaluationError, match="6n\\+2"):
        dataclasses.replace(TINY, resnet_depth=21)


def test_the_weight_average_follows_dpimagebenchs_warm_up_exactly():
    """After each Adam step, average <- average - (1 - d_n) (average - weights) with
    d_n = min(0.9999, (1 + n) / (10 + n)): checked against a numpy loop over the weights
    recorded after every step."""
    import tensorflow as tf

    model = networks.build_resnet((28, 28, 1), 10, depth=8, seed=1)
    trainer = dpimagebench._Trainer(model, TINY)
    sample = band_images(32, 0)
    x = tf.constant(dpimagebench.scaled(sample.images))
    y = tf.constant(sample.labels)
    reference = [v.numpy().astype(np.float64) for v in trainer.trainable]
    for n in range(1, 6):
        trainer._step(x, y)
        decay = dpimagebench.ema_decay_at(TINY.ema_decay, n)
        reference = [a - (1 - decay) * (a - v.numpy()) for a, v in
                     zip(reference, trainer.trainable)]
    assert dpimagebench.ema_decay_at(0.9999, 1) == pytest.approx(2 / 11)
    moved = 0.0
    for average, expected, variable in zip(trainer.average, reference, trainer.trainable):
        np.testing.assert_allclose(average.numpy(), expected, rtol=1e-5, atol=1e-6)
        moved = max(moved, float(np.max(np.abs(average.numpy() - variable.numpy()))))
    assert moved > 0            # the average is not the weights themselves


def test_evaluation_uses_the_averaged_weights_and_restores_the_trained_ones():
    model = networks.build_resnet((28, 28, 1), 10, depth=8, seed=2)
    trainer = dpimagebench._Trainer(model, TINY)
    sample = band_images(64, 1)
    trainer.train_epoch(dpimagebench.scaled(sample.images), sample.labels, 0,
                        np.random.default_rng(0))
    trained = [v.numpy() for v in trainer.trainable]
    measured = trainer.averaged_accuracy([(dpimagebench.scaled(sample.images),
                                           sample.labels)])[0]
    for variable, value in zip(trainer.trainable, trained):
        np.testing.assert_array_equal(variable.numpy(), value)
    for variable, average in zip(trainer.trainable, trainer.average):
        variable.assign(average)
    logits = model(dpimagebench.scaled(sample.images), training=False).numpy()
    assert measured == float(np.mean(logits.argmax(axis=1) == sample.labels))


def test_a_killed_run_resumes_on_the_same_trajectory(tmp_path):
    synthetic, validation, test = band_images(260, 2), band_images(60, 3), band_images(60, 4)
    straight = dpimagebench.train_classifier("resnet", synthetic, validation, test, TINY,
                                             seed=5)
    state = tmp_path / "state.npz"
    # An interrupted run: epoch 1 saved, then the process "dies" (we keep only the file).
    first = _run_epochs(synthetic, validation, test, state, stop_after=1)
    assert json.loads(str(np.load(state)["meta"]))["epoch"] == 1
    with pytest.raises(ValueError, match="other settings \\(differs in seed\\)"):
        dpimagebench.train_classifier("resnet", synthetic, validation, test, TINY, seed=6,
                                      state_path=state)
    resumed = dpimagebench.train_classifier("resnet", synthetic, validation, test, TINY,
                                            seed=5, state_path=state)
    assert first == straight["curves"]["loss"][:1]
    np.testing.assert_allclose(resumed["curves"]["loss"], straight["curves"]["loss"],
                               rtol=1e-6)
    assert resumed["curves"]["val_accuracy"] == straight["curves"]["val_accuracy"]
    assert resumed["accuracy"] == straight["accuracy"]


def test_the_own_samples_curve_shows_samples_learned_that_do_not_transfer(tmp_path):
    """``train_accuracy`` is the averaged weights' accuracy on the first rows the classifier
    trains on (recomputed here from the saved state); with real records whose classes
    look like the samples' *next* class, the classifier learns its samples (above
    chance) and scores below chance on the real records."""
    synthetic = band_images(300, 5)
    shifted = [band_images(100, seed) for seed in (6, 7)]
    validation, test = (dataclasses.replace(s, labels=(s.labels - 1) % 10) for s in shifted)
    protocol = dataclasses.replace(TINY, generated_samples=300, train_samples=280, epochs=3)
    state = tmp_path / "state.npz"
    entry = dpimagebench.train_classifier("resnet", synthetic, validation, test, protocol,
                                          seed=0, state_path=state)
    curves = entry["curves"]
    assert len(curves["train_accuracy"]) == 3
    # Ten classes: chance is 0.1; a classifier that maps each band to its class scores
    # 0 on the shifted records.
    assert max(curves["train_accuracy"]) > 0.3 > 0.1 > max(curves["test_accuracy"]
                                                            + curves["val_accuracy"])
    # Recompute the last value: the saved weights' average, inference mode, own rows.
    with np.load(state) as saved:
        arrays = [saved[f"w{i}"] for i in range(json.loads(str(saved["meta"]))["variables"])]
    init_seed = int(dpimagebench.classifier_seeds("resnet", 0)[0])
    model = dpimagebench.build_classifier("resnet", protocol, (28, 28, 1), 10, seed=init_seed)
    for variable, value in zip(model.variables, arrays):
        variable.assign(value)
    averages = arrays[len(model.variables):len(model.variables)
                      + len(model.trainable_variables)]
    for variable, average in zip(model.trainable_variables, averages):
        variable.assign(average)
    rows = dpimagebench.classifier_training_rows(300, protocol)
    assert len(rows) < dpimagebench.OWN_SAMPLES_MEASURED          # all of them measured
    logits = model(dpimagebench.scaled(synthetic.images[rows]), training=False).numpy()
    assert curves["train_accuracy"][-1] == pytest.approx(
        float(np.mean(logits.argmax(axis=1) == synthetic.labels[rows])), abs=1e-12)


def test_a_state_saved_before_the_own_samples_curve_resumes(tmp_path):
    synthetic, validation, test = band_images(260, 2), band_images(60, 3), band_images(60, 4)
    straight = dpimagebench.train_classifier("resnet", synthetic, validation, test, TINY,
                                             seed=5)
    state = tmp_path / "state.npz"
    _run_epochs(synthetic, validation, test, state, stop_after=1)
    with np.load(state) as saved:                           # as an older dclens wrote it
        arrays = dict(saved)
    meta = json.loads(str(arrays["meta"]))
    del meta["curves"]["train_accuracy"]
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(state, **arrays)
    resumed = dpimagebench.train_classifier("resnet", synthetic, validation, test, TINY,
                                            seed=5, state_path=state)
    assert resumed["curves"]["train_accuracy"][0] is None
    assert resumed["curves"]["train_accuracy"][1] == straight["curves"]["train_accuracy"][1]
    assert resumed["accuracy"] == straight["accuracy"]


def _run_epochs(synthetic, validation, test, state, stop_after):
    """Runs the protocol until ``stop_after`` epochs are saved, then abandons it."""
    class Killed(Exception):
        pass

    losses = []

    def log(line):
        if " loss " in line:                          # one line per finished epoch
            losses.append(float(line.split(" loss ")[1].split()[0]))
            if len(losses) == stop_after:
                raise Killed
    with pytest.raises(Killed):
        dpimagebench.train_classifier("resnet", synthetic, validation, test, TINY, seed=5,
                                      state_path=state, log=log)
    return [pytest.approx(x, rel=1e-3) for x in losses]


def test_the_protocol_learns_and_reports_the_mean_over_its_classifiers():
    synthetic, validation, test = band_images(300, 5), band_images(100, 6), band_images(200, 7)
    protocol = dataclasses.replace(TINY, generated_samples=300, train_samples=280, epochs=3)
    record = dpimagebench.run_dpimagebench(synthetic, test, protocol, seed=0,
                                           validation=validation, log=lambda _: None)
    entry = record["classifiers"]["resnet8"]
    assert record["accuracy"] == entry["accuracy"]
    chosen = entry["epoch"] - 1
    assert entry["accuracy"] == entry["curves"]["test_accuracy"][chosen]
    assert entry["val_accuracy"] == max(entry["curves"]["val_accuracy"])
    assert entry["best_test_accuracy"] >= entry["accuracy"]
    assert entry["accuracy"] > 0.3          # ten band classes: chance is 0.1
    assert not record["follows_dpimagebench"] and "resnet8" in record["description"]
    assert not record["all_dpimagebench_classifiers"]
    with pytest.raises(EvaluationError, match="28x28x1"):
        dpimagebench.check_images(data.dataset_spec("celebA-gender-train"))


def test_settings_refuse_screening_and_keep_old_cache_keys():
    protocol = dpimagebench.DPImageBenchProtocol()
    assert "dpimagebench" not in evaluate.EvalSettings().to_dict()
    assert evaluate.EvalSettings(dpimagebench=protocol).to_dict()["dpimagebench"][
        "generator_records"] == "private"
    with pytest.raises(EvaluationError, match="screening"):
        evaluate.EvalSettings(dpimagebench=protocol, quality=False,
                              test_set=evaluate.TUNING_HOLDOUT)
    # A ResNet-only protocol keeps the key it had before WRN and ResNeXt were built.
    assert protocol.to_dict() == {
        "generator_records": "private", "classifiers": ["resnet"], "resnet_depth": 110,
        "generated_samples": 60_000, "train_samples": 55_000, "epochs": 50,
        "batch_size": 256, "learning_rate": 0.01, "lr_step_epochs": 20, "lr_gamma": 0.2,
        "ema_decay": 0.9999}


def test_a_baseline_runs_records_reach_the_cli(tmp_path):
    """GS-WGAN / DP-SGD runs keep their settings at the top of config.json: their
    training_records must reach --protocol dpimagebench too (absent: all)."""
    from dclens.evaluation.synthetic_input import run_dir_config

    (tmp_path / "config.json").write_text(json.dumps({"config": {
        "dataset": "fashion_mnist", "training_records": "private"}}))
    assert run_dir_config(tmp_path)["train"]["training_records"] == "private"
    (tmp_path / "config.json").write_text(json.dumps({"config": {"dataset": "mnist"}}))
    assert run_dir_config(tmp_path)["train"]["training_records"] == "all"


def test_the_cli_builds_the_protocol_from_the_runs_records():
    from dclens.cli import evaluate as cli

    parser = cli.build_parser()
    args = parser.parse_args(["x", "--protocol", "dpimagebench", "--dpimagebench_depth", "20"])
    settings = cli.settings_from_args(args, "fashion_mnist", "private")
    assert settings.dpimagebench.resnet_depth == 20
    assert settings.dpimagebench.generator_records is splits.TrainingRecords.PRIVATE
    with pytest.raises(ValueError, match="--generator_records private"):
        cli.settings_from_args(args, "fashion_mnist", None)
    told = parser.parse_args(["x", "--protocol", "dpimagebench", "--generator_records", "all"])
    assert cli.settings_from_args(told, "fashion_mnist", "private").dpimagebench \
        .generator_records is splits.TrainingRecords.ALL
    with pytest.raises(ValueError, match="need --protocol dpimagebench"):
        cli.settings_from_args(parser.parse_args(["x", "--dpimagebench_depth", "20"]),
                               "fashion_mnist")


def test_the_cli_sets_another_rate_or_fewer_epochs_and_says_it_is_not_theirs():
    from dclens.cli import evaluate as cli

    parser = cli.build_parser()
    args = parser.parse_args(["x", "--protocol", "dpimagebench", "--dpimagebench_depth", "20",
                              "--dpimagebench_learning_rate", "0.001",
                              "--dpimagebench_epochs", "2"])
    protocol = cli.settings_from_args(args, "fashion_mnist", "private").dpimagebench
    assert (protocol.resnet_depth, protocol.learning_rate, protocol.epochs) == (20, 0.001, 2)
    assert not protocol.follows_dpimagebench
    assert dpimagebench.classifier_name(protocol, "resnet") == "resnet20-lr0.001"
    assert dpimagebench.classifier_name(dataclasses.replace(protocol, learning_rate=0.01),
                                        "resnet") == "resnet20"
    for flag, value, message in (("--dpimagebench_learning_rate", "-1",
                                  "learning_rate must be > 0, got -1.0"),
                                 ("--dpimagebench_learning_rate", "nan",
                                  "learning_rate must be > 0, got nan"),
                                 ("--dpimagebench_learning_rate", "inf",
                                  "learning_rate must be > 0, got inf"),
                                 ("--dpimagebench_epochs", "0",
                                  "epochs must be an integer >= 1, got 0")):
        bad = parser.parse_args(["x", "--protocol", "dpimagebench", flag, value])
        with pytest.raises(EvaluationError, match=message):
            cli.settings_from_args(bad, "fashion_mnist", "private")
        with pytest.raises(ValueError, match=f"{flag}.*need --protocol dpimagebench"):
            cli.settings_from_args(parser.parse_args(["x", flag, value]), "fashion_mnist")


def test_evaluate_runs_it_on_the_last_records_and_refuses_a_run_that_read_them(tmp_path):
    """Through evaluate(): the validation set is exactly the last 5,000 training records
    (each image carries its index in two pixels), and a run on all records is refused
    before any classifier trains."""
    from conftest import write_idx

    total = splits.TUNING_RECORDS + 40
    index = np.arange(total)
    images = np.random.default_rng(0).integers(0, 60, size=(total, 28, 28))
    images[:, 27, 0], images[:, 27, 1] = index // 256, index % 256
    folder = tmp_path / "fashion_mnist"
    folder.mkdir()
    write_idx(folder / "train-images-idx3-ubyte.gz", images)
    write_idx(folder / "train-labels-idx1-ubyte.gz", index % 10)
    validation = dpimagebench.load_validation("fashion_mnist", str(tmp_path), TINY)
    pixels = np.rint(validation.images[:, 27, :2, 0] * 255).astype(np.int64)
    np.testing.assert_array_equal(256 * pixels[:, 0] + pixels[:, 1],
                                  np.arange(total - 5_000, total))

    synthetic, test = band_images(240, 8), band_images(50, 9)
    settings = evaluate.EvalSettings(
        quality=False, schedule=evaluate.classifiers.Schedule(epochs=1),
        dpimagebench=dataclasses.replace(TINY, epochs=1))
    lines = []
    record = evaluate.evaluate(synthetic, test, settings, data_dir=str(tmp_path),
                               log=lines.append)
    entry = record["protocols"]["dpimagebench"]
    assert entry["validation"].endswith(f"records {total - 5_000}-{total - 1})")
    assert 0 <= entry["accuracy"] <= 1 and "resnet8" in entry["classifiers"]
    refused = settings.replace(dpimagebench=dataclasses.replace(TINY, generator_records="all"))
    lines.clear()
    with pytest.raises(EvaluationError, match="'all' records"):
        evaluate.evaluate(synthetic, test, refused, data_dir=str(tmp_path), log=lines.append)
    assert not any("epoch" in line for line in lines)       # nothing trained first
