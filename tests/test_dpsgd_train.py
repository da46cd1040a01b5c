"""The private classifier loop (dclens/dpsgd/train.py, scripts/dpsgd.py) on tiny data:
the split is disjoint, the ledger counts every step before its noise, a killed run resumes
without under-counting, the budget holds, bad settings are refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dclens.runs import journal
from dclens.privacy import sampled_ledger
from dclens.dpsgd import private_step, train
from dclens.dpsgd.config import DpsgdConfig, DpsgdConfigError
from dclens.common.rng import SeedTree
from conftest import load_script


def _cli():
    return load_script("dpsgd")


def _config(data_dir, **changes):
    values = dict(data_dir=str(data_dir), target_eps=4.0, batch_size=20, epochs=2.0,
                  validation=20, anchors=10, num_bases=8, checkpoint_every=3, seed=5)
    values.update(changes)
    return DpsgdConfig(**values)


def test_split_is_disjoint_and_covers_every_record():
    config = DpsgdConfig(method="gep", validation=7, anchors=5, batch_size=10)
    ids = np.arange(40, dtype=np.float32)
    images = np.broadcast_to(ids[:, None, None, None], (40, 28, 28, 1)).copy()
    split = train.split_records(images, np.arange(40) % 10, config, SeedTree(1), 10)
    parts = [split.private_images[:, 0, 0, 0], split.validation_images[:, 0, 0, 0],
             split.anchor_images[:, 0, 0, 0]]
    assert [len(p) for p in parts] == [28, 7, 5]
    assert sorted(np.concatenate(parts).tolist()) == ids.tolist()     # disjoint, complete
    with pytest.raises(DpsgdConfigError, match="leaves 8 private examples"):
        DpsgdConfig(method="gep", validation=20, anchors=12, batch_size=10).check_data(40)


def test_noise_anchors_touch_no_record():
    """anchor_source = noise: no record is held out for anchors (private = all but the
    validation images), and the anchors are the same whatever the data -- swapping every
    training record adversarially leaves them bit-identical."""
    config = DpsgdConfig(method="gep", validation=7, anchors=5, batch_size=10,
                         anchor_source="noise")
    ids = np.arange(40, dtype=np.float32) / 40
    images = np.broadcast_to(ids[:, None, None, None], (40, 28, 28, 1)).copy()
    split = train.split_records(images, np.arange(40) % 10, config, SeedTree(1), 10)
    assert len(split.private_labels) == 33 and config.held_out == 7
    other = train.split_records(1.0 - images, (np.arange(40) + 3) % 10, config,
                                SeedTree(1), 10)
    assert split.anchor_images.shape == (5, 28, 28, 1)
    assert np.array_equal(split.anchor_images, other.anchor_images)
    assert np.array_equal(split.anchor_labels, other.anchor_labels)
    assert not np.isin(split.anchor_images[:, 0, 0, 0], ids).any()
    with pytest.raises(DpsgdConfigError, match="anchor_source = 'public'"):
        DpsgdConfig(method="gep", anchor_source="public")


@pytest.mark.parametrize("method", ["gm", "topagg", "gep"])
def test_a_run_spends_every_step_within_the_budget(tiny_fmnist_dir, tmp_path, method):
    config = _config(tiny_fmnist_dir, method=method)
    report = train.train_private_classifier(config, str(tmp_path / "run"), progress=False,
                                            log=lambda line: None)
    privacy = report["privacy"]
    n = 120 - config.held_out
    assert privacy["private_examples"] == n
    assert privacy["steps"] == privacy["planned_steps"] == round(2.0 * n / 20)
    assert privacy["lost_steps"] == 0
    assert privacy["sampling_rate"] == pytest.approx(20 / n, rel=1e-15)
    assert privacy["epsilon"]["epsilon"] <= 4.0
    assert "add or remove one example" in privacy["adjacency"]
    assert "n public" in privacy["adjacency"]
    # n, q, the steps and sigma come from the actual n: the guarantee says so precisely.
    assert f"parameters of n = {n}" in privacy["guarantee"]
    assert "held-out split fixed" in privacy["guarantee"]
    assert "n itself" in privacy["guarantee"]
    assert f"{config.held_out} held-out images are used without privacy" in privacy["unit"]
    assert "NOT covered by this epsilon" in privacy["hyperparameter_selection"] \
        or method == "gep"
    assert accuracy_of_saved(report) == report["accuracy"]["test_at_chosen"]
    record = journal.PrivacyJournal.load(tmp_path / "run" / "ledger.json")
    assert isinstance(record.ledger, sampled_ledger.SampledGaussianLedger)
    assert record.queries == privacy["steps"] and len(record.entries) == privacy["steps"]
    assert record.ledger.epsilon().epsilon == privacy["epsilon"]["epsilon"]
    expected = sampled_ledger.SampledGaussianLedger(delta=1e-5)
    expected.spend(_event(config, privacy["sigma"], privacy["sampling_rate"],
                          privacy["steps"]))
    assert expected.epsilon().epsilon == pytest.approx(privacy["epsilon"]["epsilon"],
                                                       rel=1e-12)
    accuracy = report["accuracy"]
    assert accuracy["saved_model_step"] == accuracy["chosen_step"]
    chosen = [c for c in report["curves"] if c["step"] == accuracy["chosen_step"]][0]
    assert chosen["validation"] == max(c["validation"] for c in report["curves"])
    assert (tmp_path / "run" / "model.keras").stat().st_size > 0
    for folder in ("checkpoints", "logs"):
        assert (tmp_path / "run" / folder / "PRIVATE").is_file()
    assert "provenance" in json.loads((tmp_path / "run" / "config.json").read_text())
    assert "publish?" in (tmp_path / "run" / "README.md").read_text()


def accuracy_of_saved(report):
    """The test accuracy the report gives for the weights model.keras holds."""
    step = report["accuracy"]["saved_model_step"]
    return [c for c in report["curves"] if c["step"] == step][-1]["test"]


def test_model_keras_holds_the_validation_chosen_weights(tiny_fmnist_dir, tmp_path,
                                                         monkeypatch):
    """The headline accuracy is the chosen evaluation's, so model.keras must hold that
    evaluation's weights, not the final ones (it used to hold the final weights).  The
    validation accuracy is scripted to peak at the first evaluation, whose weights are
    recorded; a crash and resume in between must not lose them."""
    import keras

    real_accuracy = private_step.Classifier.accuracy
    seen = {"calls": 0, "first": None}

    def scripted(self, images, labels, batch=2000):
        if len(labels) == 20:                               # the validation images
            seen["calls"] += 1
            if seen["calls"] == 1:
                seen["first"] = [w.copy() for w in self.keras.get_weights()]
                return 1.0
            return 0.0
        return real_accuracy(self, images, labels, batch)

    monkeypatch.setattr(private_step.Classifier, "accuracy", scripted)
    config = _config(tiny_fmnist_dir, sigma=1.5, target_eps=None, eval_every=2,
                     checkpoint_every=2)

    def kill(point, step):
        if point == "after_spend" and step == 5:
            raise _Killed
    with pytest.raises(_Killed):
        train.train_private_classifier(config, str(tmp_path / "run"), progress=False,
                                       log=lambda line: None, hook=kill)
    report = train.train_private_classifier(config, str(tmp_path / "run"), progress=False,
                                            log=lambda line: None)
    assert report["accuracy"]["chosen_step"] == report["accuracy"]["saved_model_step"] == 2
    saved = keras.models.load_model(tmp_path / "run" / "model.keras").get_weights()
    assert len(saved) == len(seen["first"])
    for got, want in zip(saved, seen["first"]):
        np.testing.assert_array_equal(got, want)


def test_the_privacy_record_says_how_the_learning_rate_was_chosen():
    from dclens.dpsgd.config import learning_rate_selection

    assert "NOT covered by this epsilon" in learning_rate_selection(DpsgdConfig())
    assert "the records this run treats as private" in learning_rate_selection(DpsgdConfig())
    assert "Fashion-MNIST, not mnist" in learning_rate_selection(DpsgdConfig(dataset="mnist"))
    assert "was given" in learning_rate_selection(DpsgdConfig(learning_rate=0.7))
    assert "not tuned on any data" in learning_rate_selection(DpsgdConfig(method="gep"))


def _event(config, sigma, rate, steps):
    import dp_accounting

    gaussian = dp_accounting.GaussianDpEvent(sigma)
    inner = dp_accounting.ComposedDpEvent([gaussian, gaussian]) if config.method.value == \
        "gep" else gaussian
    return dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(rate, inner),
                                             steps)


class _Killed(RuntimeError):
    pass


def test_a_killed_run_resumes_and_counts_the_lost_steps(tiny_fmnist_dir, tmp_path):
    """Killed after journaling step index 4 (the checkpoint holds 3 done steps): steps 3
    and 4 were spent but their results lost; the resumed run redoes them with fresh noise
    and its ledger holds two steps more than the uninterrupted run's."""
    config = _config(tiny_fmnist_dir, sigma=1.5, target_eps=None)
    whole = train.train_private_classifier(config, str(tmp_path / "whole"), progress=False,
                                           log=lambda line: None)

    def kill(point, step):
        if point == "after_spend" and step == 4:
            raise _Killed
    with pytest.raises(_Killed):
        train.train_private_classifier(config, str(tmp_path / "run"), progress=False,
                                       log=lambda line: None, hook=kill)
    lines = []
    resumed = train.train_private_classifier(config, str(tmp_path / "run"), progress=False,
                                             log=lines.append)
    assert any("resuming at step 3" in line and "2 of them lost" in line for line in lines)
    steps = whole["privacy"]["steps"]
    assert resumed["privacy"]["steps"] == steps + 2 and resumed["privacy"]["lost_steps"] == 2
    assert resumed["privacy"]["epsilon"]["epsilon"] > whole["privacy"]["epsilon"]["epsilon"]
    # The redone steps drew other noise and other samples (attempt 1), not a replay of the
    # lost draws, so the final model differs from the uninterrupted run's.
    import keras

    # (model.keras holds the validation-chosen weights, so compare the final checkpoints.)
    from dclens.runs.checkpoint import CheckpointStore

    finals = [CheckpointStore(str(tmp_path / name / "checkpoints")).latest()
              for name in ("whole", "run")]
    assert finals[0].step == finals[1].step
    assert any(np.max(np.abs(finals[0].load_array(k) - finals[1].load_array(k))) > 1e-6
               for k in ("w0", "w1", "w2"))
    # A finished run asked again changes nothing and spends nothing.
    again = train.train_private_classifier(config, str(tmp_path / "run"), progress=False,
                                           log=lambda line: None)
    assert again["privacy"]["steps"] == resumed["privacy"]["steps"]


def test_a_redone_step_draws_a_fresh_poisson_sample():
    """Sampling is keyed by (attempt, step): the same attempt replays its sample (resume
    is deterministic), another attempt draws an independent one, because the ledger
    counts a lost and a redone step as two independently sampled mechanisms."""
    seeds = SeedTree(3)
    first = train.batch_for(seeds, step=7, attempt=0, private=2000, rate=0.05)
    assert np.array_equal(first, train.batch_for(seeds, step=7, attempt=0, private=2000,
                                                 rate=0.05))
    redone = train.batch_for(seeds, step=7, attempt=1, private=2000, rate=0.05)
    # ~100 of 2000 each; independent samples share ~5 indices, never all of them.
    assert len(np.intersect1d(first, redone)) < min(len(first), len(redone)) // 2


def test_a_resume_with_other_privacy_settings_is_refused(tiny_fmnist_dir, tmp_path):
    from dclens.runs import rundir

    config = _config(tiny_fmnist_dir, epochs=0.5)
    train.train_private_classifier(config, str(tmp_path / "run"), progress=False,
                                   log=lambda line: None)
    with pytest.raises(rundir.RunDirError, match="clip: saved 1.0, now 2.0"):
        train.train_private_classifier(_config(tiny_fmnist_dir, epochs=0.5, clip=2.0),
                                       str(tmp_path / "run"), progress=False,
                                       log=lambda line: None)


def test_settings_are_checked_by_name():
    for changes, match in (({"method": "sgd"}, "method = 'sgd'"),
                           ({"target_eps": 1.0, "sigma": 1.0}, "exactly one of"),
                           ({"target_eps": None}, "exactly one of"),
                           ({"topk": 1.5}, "topk = 1.5"),
                           ({"momentum": 1.0}, "momentum"),
                           ({"batch_size": 0}, "batch_size = 0"),
                           ({"method": "gep", "anchors": 0}, "anchors = 0")):
        with pytest.raises(DpsgdConfigError, match=match):
            DpsgdConfig(**changes)


def test_the_learning_rate_defaults_per_method_and_a_given_one_is_kept():
    from dclens.dpsgd.config import DEFAULT_LEARNING_RATES

    assert DpsgdConfig().learning_rate == DEFAULT_LEARNING_RATES[DpsgdConfig().method] == 2.0
    assert DpsgdConfig(method="gep").learning_rate == 0.1
    assert DpsgdConfig(method="topagg", learning_rate=0.7).learning_rate == 0.7
    assert DpsgdConfig(method="gep").to_dict()["learning_rate"] == 0.1     # stored resolved
    with pytest.raises(DpsgdConfigError, match="learning_rate = -1"):
        DpsgdConfig(learning_rate=-1.0)


def test_the_step_decay_schedule_is_exact():
    """lr * decay^m, m = the milestones passed (step >= fraction * total): GEP's code's
    0.5 / 0.75 with 0.1 on 100 steps is 1 for steps 0-49, 0.1 for 50-74, 0.01 after."""
    config = DpsgdConfig(learning_rate=1.0, lr_milestones=(0.5, 0.75), lr_decay=0.1)
    rates = [config.learning_rate_at(step, 100) for step in (0, 49, 50, 74, 75, 99)]
    assert rates == [1.0, 1.0, 0.1, 0.1, pytest.approx(0.01, rel=1e-12),
                     pytest.approx(0.01, rel=1e-12)]
    assert config.to_dict()["lr_milestones"] == [0.5, 0.75]        # JSON-shaped
    plain = DpsgdConfig(learning_rate=0.3)
    assert {plain.learning_rate_at(step, 10) for step in range(10)} == {0.3}
    for changes, match in (({"lr_milestones": (0.75, 0.5)}, "lr_milestones"),
                           ({"lr_milestones": (1.0,)}, "lr_milestones"),
                           ({"lr_milestones": "half"}, "lr_milestones = 'half'"),
                           ({"lr_decay": 0.0}, "lr_decay = 0.0"),
                           ({"lr_decay": 1.5}, "lr_decay = 1.5")):
        with pytest.raises(DpsgdConfigError, match=match):
            DpsgdConfig(**changes)


def test_the_loop_applies_the_schedule(tiny_fmnist_dir, tmp_path):
    """With the rate cut to ~0 at half of 2 epochs, a run ends where a 1-epoch run with
    the same sigma ends (same keyed samples and noise for those steps); without the cut
    it goes on moving."""
    import keras

    common = dict(sigma=1.5, target_eps=None, epochs=2.0)
    configs = {"cut": _config(tiny_fmnist_dir, lr_milestones=(0.5,), lr_decay=1e-30, **common),
               "half": _config(tiny_fmnist_dir, **{**common, "epochs": 1.0}),
               "whole": _config(tiny_fmnist_dir, **common)}
    reports, weights = {}, {}
    for name, config in configs.items():
        reports[name] = train.train_private_classifier(config, str(tmp_path / name),
                                                       progress=False, log=lambda line: None)
        weights[name] = keras.models.load_model(tmp_path / name / "model.keras").get_weights()
    assert reports["cut"]["privacy"]["steps"] == 2 * reports["half"]["privacy"]["steps"]
    for a, b in zip(weights["cut"], weights["half"]):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert max(np.max(np.abs(a - b)) for a, b in zip(weights["whole"], weights["half"])) > 1e-3


def test_a_run_made_before_a_setting_existed_resumes_at_its_default(tiny_fmnist_dir,
                                                                    tmp_path):
    """config.json of an older dclens lacks lr_milestones / lr_decay: the run resumes
    (their defaults are what it did); asking for a schedule it did not have is refused."""
    from dclens.runs import rundir

    config = _config(tiny_fmnist_dir, epochs=0.5)
    train.train_private_classifier(config, str(tmp_path / "run"), progress=False,
                                   log=lambda line: None)
    path = tmp_path / "run" / "config.json"
    saved = json.loads(path.read_text())
    for name in ("lr_milestones", "lr_decay"):
        del saved["config"][name]
    path.write_text(json.dumps(saved))
    again = train.train_private_classifier(config, str(tmp_path / "run"), progress=False,
                                           log=lambda line: None)
    assert again["privacy"]["steps"] >= 1
    with pytest.raises(rundir.RunDirError, match="lr_milestones"):
        train.train_private_classifier(_config(tiny_fmnist_dir, epochs=0.5,
                                               lr_milestones=(0.5,)),
                                       str(tmp_path / "run"), progress=False,
                                       log=lambda line: None)


def test_cli_runs_and_reports(tiny_fmnist_dir, tmp_path, capsys):
    cli = _cli()
    code = cli.main(["--method", "topagg", "--data_dir", str(tiny_fmnist_dir),
                     "--target_eps", "3", "--batch_size", "20", "--epochs", "1",
                     "--validation", "20", "--run_dir", str(tmp_path / "run"), "--quiet"])
    assert code == 0
    out = capsys.readouterr().out
    assert "topagg: test" in out and "epsilon" in out
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["config"]["topk"] == 0.8 and report["privacy"]["epsilon"]["epsilon"] <= 3
    with pytest.raises(SystemExit):
        cli.main(["--run_dir", str(tmp_path / "x"), "--topk", "2"])
    assert "topk = 2.0" in capsys.readouterr().err


def test_ctrl_c_in_a_dpsgd_run_prints_one_resume_line_and_exits_130(tmp_path, monkeypatch,
                                                                    capsys):
    cli = _cli()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli.train, "train_private_classifier", interrupted)
    argv = ["--run_dir", str(tmp_path / "run"), "--quiet"]
    assert cli.main(argv) == 130
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0] == ("dpsgd.py: interrupted before the first step; kept: nothing (no spend "
                        f"was made); resume with: python scripts/dpsgd.py {' '.join(argv)}")
