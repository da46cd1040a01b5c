"""The authors' evaluation protocol (dclens/evaluation/authors_protocol.py): the fast path that skips
the zero rows follows the literal 100,000-row path (here scaled down), and the zero rows
really scale every step down (a run without them differs)."""

import dataclasses

import numpy as np
import pytest

from dclens.evaluation import authors_protocol, classifiers
from dclens import data
from conftest import load_script

SPEC = data.dataset_spec("fashion_mnist")


def _labeled(n, seed):
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 10
    images = rng.uniform(0, 0.3, size=(n, 28, 28, 1)).astype(np.float32)
    for i, label in enumerate(labels):
        images[i, 2 * label + 2:2 * label + 6, 4:24, 0] = 0.9
    return data.LabeledImages(images, labels.astype(np.int64), SPEC, "synthetic")


SMALL = authors_protocol.AuthorsProtocol(range=1, rows_per_pickle=60, rows=300,
                                         batch_size=32, epochs=3, learning_rate=0.05)


def test_fast_path_equals_the_literal_zero_row_array():
    synthetic, test = _labeled(100, 0), _labeled(40, 1)
    fast = authors_protocol.train_authors_protocol(synthetic, test, SMALL, seed=3,
                                                   return_weights=True)
    literal = authors_protocol.train_authors_protocol(synthetic, test, SMALL, seed=3,
                                                      literal=True, return_weights=True)
    for a, b in zip(fast["weights"], literal["weights"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)   # float32 summation order
    np.testing.assert_allclose(fast["curves"]["test_accuracy"],
                               literal["curves"]["test_accuracy"], atol=1 / 40 + 1e-9)
    np.testing.assert_allclose(fast["curves"]["loss"], literal["curves"]["loss"], rtol=1e-4)
    # Training moved the weights (the comparison is not of two untouched models).
    untouched = authors_protocol.train_authors_protocol(
        synthetic, test, dataclasses.replace(SMALL, epochs=1, learning_rate=1e-12), seed=3,
        return_weights=True)
    assert max(np.max(np.abs(a - b)) for a, b in
               zip(fast["weights"], untouched["weights"])) > 1e-3


def test_zero_rows_scale_the_steps_down():
    """Without the zero rows (same real rows, batches of real rows only), training differs:
    the denominator of the authors' batches is what the fast path must keep."""
    synthetic, test = _labeled(100, 0), _labeled(40, 1)
    with_zeros = authors_protocol.train_authors_protocol(synthetic, test, SMALL, seed=3,
                                                         return_weights=True)
    no_zeros = authors_protocol.train_authors_protocol(
        synthetic, test, dataclasses.replace(SMALL, rows=60), seed=3, return_weights=True)
    gap = max(np.max(np.abs(a - b)) for a, b in
              zip(with_zeros["weights"], no_zeros["weights"]))
    assert gap > 1e-3


def test_range_reads_the_first_pickles_and_is_checked():
    synthetic = _labeled(100, 0)
    images, one_hot = authors_protocol.authors_rows(synthetic, SMALL)
    np.testing.assert_array_equal(images, synthetic.images[:60])
    np.testing.assert_array_equal(one_hot.argmax(1), synthetic.labels[:60])
    with pytest.raises(ValueError, match="reads 120 samples but only 100"):
        authors_protocol.authors_rows(synthetic, dataclasses.replace(SMALL, range=2))
    with pytest.raises(ValueError, match="exceeds the 300 rows"):
        dataclasses.replace(SMALL, range=6)
    assert authors_protocol.AuthorsProtocol(range=10).is_authors
    assert not SMALL.is_authors


def test_evaluate_reports_the_authors_protocol_beside_val_and_sen(tmp_path):
    from dclens.evaluation import classifiers, evaluate, record_outputs

    synthetic, test = _labeled(100, 0), _labeled(40, 1)
    settings = evaluate.EvalSettings(schedule=classifiers.Schedule(epochs=1, batch_size=16),
                                     quality=False, authors=SMALL)
    record = evaluate.evaluate(synthetic, test, settings, log=lambda line: None)
    assert set(record["protocols"]) == {"val", "sen", "authors_range1"}
    authors = record["protocols"]["authors_range1"]
    assert authors["accuracy"] == max(authors["curve"]["test_accuracy"])
    assert authors["settings"]["range"] == 1 and not authors["authors_settings"]
    assert record["headline"] == "val"
    assert "authors (range 1)" in record_outputs.summary_line(record)
    paths = record_outputs.write_outputs(record, tmp_path)
    assert (tmp_path / "evaluation.png").stat().st_size > 0 and paths["json"]


def test_cli_flags_build_the_authors_protocol():
    cli = load_script("evaluate")
    parse = cli.build_parser().parse_args
    settings = cli.settings_from_args(parse(["x", "--protocol", "authors", "--range", "10"]),
                                      "fashion_mnist")
    assert settings.authors == authors_protocol.AuthorsProtocol(range=10)
    quick = cli.settings_from_args(parse(["x", "--protocol", "authors", "--authors_epochs",
                                          "5"]), "fashion_mnist")
    assert quick.authors.epochs == 5 and not quick.authors.is_authors
    assert cli.settings_from_args(parse(["x"]), "fashion_mnist").authors is None
    with pytest.raises(ValueError, match="need --protocol authors"):
        cli.settings_from_args(parse(["x", "--range", "2"]), "fashion_mnist")


def test_a_killed_run_resumes_on_the_same_trajectory(tmp_path):
    """Two epochs, stop, resume for the rest: the same weights and curves as one
    uninterrupted run (bit for bit: same graph, same shuffles, same masks); a finished
    state returns its record without training; other settings are refused by name."""
    synthetic, test = _labeled(100, 0), _labeled(40, 1)
    state = tmp_path / "authors.npz"
    whole = authors_protocol.train_authors_protocol(synthetic, test, SMALL, seed=3,
                                                    return_weights=True)
    part = authors_protocol.train_authors_protocol(synthetic, test, SMALL, seed=3,
                                                   state_path=state, stop_after_epochs=2)
    assert not part["finished"] and part["curves"]["epoch"] == [1, 2]
    rest = authors_protocol.train_authors_protocol(synthetic, test, SMALL, seed=3,
                                                   state_path=state, return_weights=True)
    assert rest["finished"] and rest["curves"]["epoch"] == [1, 2, 3]
    for a, b in zip(whole["weights"], rest["weights"]):
        np.testing.assert_array_equal(a, b)
    assert rest["curves"]["test_accuracy"] == whole["curves"]["test_accuracy"]
    assert rest["curves"]["loss"] == whole["curves"]["loss"]
    lines = []
    again = authors_protocol.train_authors_protocol(synthetic, test, SMALL, seed=3,
                                                    state_path=state, return_weights=True,
                                                    log=lines.append)
    assert lines == [f"authors protocol: resumed after epoch 3 from {state}"]   # no epoch ran
    assert again["curves"] == rest["curves"]
    for a, b in zip(again["weights"], rest["weights"]):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="differs in seed"):
        authors_protocol.train_authors_protocol(synthetic, test, SMALL, seed=4,
                                                state_path=state)
    other = _labeled(100, 5)
    with pytest.raises(ValueError, match="differs in samples"):
        authors_protocol.train_authors_protocol(other, test, SMALL, seed=3, state_path=state)


def test_the_cli_keeps_the_authors_state_beside_its_outputs_and_resumes(
        tmp_path, tiny_fmnist_dir, capsys):
    """scripts/evaluate.py --protocol authors saves the loop's state in
    <out>/<name>-authors-range<R>.npz: the same call again resumes from it (here: a
    finished state, so no epoch runs and the record is the same), and other samples at
    that path are refused by name instead of being mixed in."""
    import json

    from dclens.common import export

    cli = load_script("evaluate")
    synthetic = _labeled(10000, 0)
    npz = tmp_path / "samples.npz"
    export.write_samples_npz(npz, synthetic.images, synthetic.labels)
    command = [str(npz), "--dataset", "fashion_mnist", "--data_dir", str(tiny_fmnist_dir),
               "--no_quality", "--epochs", "1", "--protocol", "authors",
               "--authors_epochs", "2"]
    assert cli.main(command) == 0
    state = tmp_path / "evaluation-authors-range1.npz"
    assert state.exists()
    first = json.loads((tmp_path / "evaluation.json").read_text())
    capsys.readouterr()
    assert cli.main(command) == 0
    assert f"authors protocol: resumed after epoch 2 from {state}" in capsys.readouterr().out
    again = json.loads((tmp_path / "evaluation.json").read_text())
    assert (again["protocols"]["authors_range1"]["curve"]
            == first["protocols"]["authors_range1"]["curve"])

    other = _labeled(10000, 7)
    export.write_samples_npz(npz, other.images, other.labels)
    assert cli.main(command) == 2
    assert "differs in samples" in capsys.readouterr().err
    assert cli.main(command + ["--name", "other"]) == 0          # its own state file
    assert (tmp_path / "other-authors-range1.npz").exists()


def test_the_compiled_test_pass_equals_the_eager_accuracy():
    """The per-epoch test accuracy comes from a compiled forward pass; it must count the
    same predictions as classifiers.accuracy (eager), chunk boundaries included."""
    synthetic, test = _labeled(60, 0), _labeled(2_345, 1)
    trainer = authors_protocol._Trainer(SPEC.image_shape, SPEC.num_classes, SMALL, seed=4)
    images, one_hot = authors_protocol.authors_rows(synthetic, SMALL)
    epochs = authors_protocol._FastEpochs(trainer, images, one_hot)
    order = np.random.default_rng(0).permutation(SMALL.rows)
    for epoch in range(1, 3):   # an untrained and a trained model
        expected = classifiers.accuracy(trainer.model, test.images, test.labels)
        assert trainer.test_accuracy(test.images, test.labels) == expected
        assert np.isnan(trainer.test_accuracy(test.images[:0], test.labels[:0]))
        epochs(authors_protocol._epoch_batches(order, SMALL, epoch, mask_seed=7))
    assert 0.0 <= expected <= 1.0
