"""A DP-MERF run: release the embedding once, fit the generator, sample.

Order (the write-ahead rule of :mod:`dclens.runs.journal`): the release's spend is in the
ledger and on disk before its noise is drawn; the noisy sum is written atomically to
``release.npz`` (publishable: it is the DP output), and everything after it -- the fit,
``generator.keras``, the samples -- is post-processing of that file.  A crash before
``release.npz`` lands leaves a journaled spend without a release: the next call spends
again with fresh noise (the lost spend stays counted, and privacy.json lists it under
``lost_releases``).  A crash after it refits from the same release at no privacy cost and
without reading the training records (the release records n, its noise multiplier and the
random features' digest, checked before the refit).  A run whose ``report.json`` exists is
finished.
"""

from __future__ import annotations

import json
import os
import time
from typing import Callable

import numpy as np

from dclens.common import export
from dclens.common.rng import SeedTree, Stream
from dclens import data
from dclens.data import splits
from dclens.datalens import networks
from dclens.datalens.build import image_shape_of
from dclens.datalens.sample import generator_function, sample_generator
from dclens.datalens.merf import features as features_lib
from dclens.datalens.merf import fit, mechanism
from dclens.datalens.merf.config import CHANGEABLE_ON_RESUME, MerfConfig
from dclens.privacy import accounting
from dclens.runs import rundir

RELEASE_FILE = "release.npz"
REPORT_FILE = "report.json"
GENERATOR_FILE = "generator.keras"


def calibrated_noise_multiplier(target_eps: float, delta: float,
                                conversion: accounting.Conversion) -> float:
    """The smallest noise multiplier z for which the release alone costs at most
    ``target_eps`` at ``delta`` under ``conversion``.  The release is one Gaussian
    mechanism of sensitivity 2, i.e. one TopAgg call with k = 1: TopAgg's calibrated sigma
    is the release's noise std 2 z."""
    sigma = accounting.calibrate_sigma(target_epsilon=target_eps, topk=1, queries_per_step=1,
                                       steps=1, delta=delta, conversion=conversion)
    return sigma / mechanism.SENSITIVITY


def noise_multiplier(config: MerfConfig) -> float:
    """The release's noise multiplier: ``sigma`` or the calibrated one, times
    ``noise_scale``."""
    base = (config.sigma if config.sigma is not None else
            calibrated_noise_multiplier(config.target_eps, config.delta, config.conversion))
    return base * config.noise_scale


def new_ledger(config: MerfConfig) -> accounting.PrivacyLedger:
    return accounting.PrivacyLedger(
        delta=config.delta, conversion=config.conversion,
        orders=(accounting.classic_orders() if config.conversion is
                accounting.Conversion.CLASSIC else None))


def build_generator(config: MerfConfig, shape: networks.ImageShape, seed: int):
    """The DataLens student generator with the run's width and upsampling."""
    return networks.build_generator(shape, config.z_dim, seed=seed,
                                    filters=config.generator_filters,
                                    dense=config.generator_dense,
                                    upsampling=config.generator_upsampling.value)


def _read_release(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with np.load(path) as stored:
        return {name: stored[name] for name in stored.files}


def _write_release(path: str, total: np.ndarray, *, records: int, z: float,
                   attempt: int, features: features_lib.FourierFeatures) -> None:
    """``release.npz``: the noisy sum and what a refit must match (the record count n, the
    noise multiplier, the attempt it was drawn for, the features' digest)."""
    def write(stream) -> None:
        np.savez(stream, noisy_sum=total, records=np.int64(records),
                 noise_multiplier=np.float64(z), attempt=np.int64(attempt),
                 features_sha256=np.str_(features.digest()))
    export.atomic_write(path, write)


def _checked_release(released: dict, path: str, *, records: int, z: float,
                     features: features_lib.FourierFeatures, classes: int) -> np.ndarray:
    """The noisy sum of a saved release, after checking it was made for this run: the same
    record count, noise multiplier, shape and random features (a release of an older
    dclens has no features digest: its shape is checked).

    Raises:
      rundir.RunDirError: a mismatch (named); refitting against other features or another
        n would fit a wrong embedding, silently.
    """
    noisy = released["noisy_sum"]
    problems = []
    if int(released["records"]) != records:
        problems.append(f"{int(released['records'])} records, this run {records}")
    if not np.isclose(float(released["noise_multiplier"]), z, rtol=1e-9, atol=0.0):
        problems.append(f"noise multiplier {float(released['noise_multiplier']):.9g}, this "
                        f"run {z:.9g}")
    if noisy.shape != (features.dim, classes):
        problems.append(f"shape {noisy.shape}, this run {(features.dim, classes)}")
    if "features_sha256" in released and str(released["features_sha256"]) != features.digest():
        problems.append("other random features (a different numpy may draw other "
                        "frequencies from the same seed)")
    if problems:
        raise rundir.RunDirError(
            f"{path} was made for another run ({'; '.join(problems)}): refitting to it would "
            f"fit a wrong embedding. Resume with the numpy and settings it was made with, "
            f"or start over (--restart: a new release, counted)")
    return noisy


def _load_records(config: MerfConfig):
    """The private training records (read only to make the release)."""
    return splits.load_training_records(config.dataset, config.data_dir,
                                        config.training_records, limit=config.max_records,
                                        progress=False)


def privacy_record(config: MerfConfig, ledger: accounting.PrivacyLedger, z: float,
                   records: int, source: str, lost: int) -> dict:
    """privacy.json of a DP-MERF run (``source``: which records, from the loader)."""
    seeded = config.seed is not None
    return {
        "private": True, "reproducible_noise": seeded, "delta": config.delta,
        "conversion": config.conversion.value,
        "epsilon": ledger.epsilon().to_dict(),
        "mechanism": "Gaussian mechanism on the class-conditional random-Fourier-feature "
                     "embedding sum (dclens.datalens.merf.mechanism)",
        "unit": "replacing one training record",
        "sensitivity": mechanism.SENSITIVITY, "noise_multiplier": z,
        "noise_scale": config.noise_scale, "records": records,
        "training_records": config.training_records.value, "records_source": source,
        "releases": ledger.queries, "lost_releases": lost,
        "ledger": ledger.state_dict(),
        "accounting_proven": True,
        "hyperparameter_selection": accounting.HYPERPARAMETER_SELECTION,
    }


def _write_samples(render, config: MerfConfig, shape: networks.ImageShape, seeds: SeedTree,
                   root: str) -> None:
    """``samples.npz``: ``config.num_samples`` samples, labels uniform over the classes."""
    images, labels = sample_generator(render, shape, config.z_dim, config.num_samples,
                                      seeds=seeds, batch=500)
    export.write_samples_npz(os.path.join(root, "samples.npz"), images, labels)


def _resample(config: MerfConfig, root: str, report: dict, seeds: SeedTree,
              log: Callable[[str], None]) -> dict:
    """A finished run asked for another ``num_samples``: draws them from its saved
    generator into ``samples.npz`` (the old ones kept as ``samples-<old number>.npz``) and records the number in
    ``report.json``.  The generator is post-processing of the release, so this spends
    nothing and the ledger is not touched.  Which samples are drawn depends on the number
    (labels first, then latents, from the run's sample stream)."""
    generator = networks.load_generator(os.path.join(root, GENERATOR_FILE))
    before = report.get("num_samples")
    old_samples = os.path.join(root, "samples.npz")
    kept = os.path.join(root, f"samples-{before}.npz")
    if os.path.exists(old_samples) and not os.path.exists(kept):
        os.replace(old_samples, kept)           # the earlier samples are kept, not lost
    shape = image_shape_of(data.dataset_spec(config.dataset))
    _write_samples(generator_function(generator), config, shape, seeds, root)
    report = {**report, "num_samples": config.num_samples}
    export.write_json(os.path.join(root, REPORT_FILE), report)
    log(f"{root} is finished: drew {config.num_samples} samples from its fitted generator "
        f"instead of {before} (post-processing of the release: no new spend)")
    return report


def train_merf(config: MerfConfig, run_dir: str, *, restart: bool = False,
               log: Callable[[str], None] = print) -> dict:
    """Runs (or finishes) the DP-MERF run in ``run_dir``; returns its report."""
    started = time.perf_counter()
    opened = rundir.open_run(config, run_dir, kind="merf", restart=restart,
                             changeable=CHANGEABLE_ON_RESUME, log=log)
    paths = opened.paths
    report_path = os.path.join(paths.root, REPORT_FILE)
    seeds = SeedTree(opened.root_seed)
    if opened.resuming and os.path.exists(report_path):
        with open(report_path) as stream:
            report = json.load(stream)
        if report.get("num_samples") == config.num_samples:
            log(f"{run_dir} is finished (report.json); --restart to start over")
            return report
        return _resample(config, paths.root, report, seeds, log)
    shape = image_shape_of(data.dataset_spec(config.dataset))
    z = noise_multiplier(config)
    features = features_lib.draw(shape.dim, config.num_features, config.lengthscale,
                                 seeds.numpy(Stream.FOURIER_FEATURES))
    records = None
    if opened.resuming:
        rundir.complete_run_files(paths, kind="merf", root_seed=opened.root_seed,
                                  seeded=config.seed is not None)
        journal = rundir.open_journal(paths, None, new_ledger=lambda: new_ledger(config))
        facts = rundir.read_run_record(paths)
        n, source = int(facts["records"]), facts["dataset_source"]
    else:
        records = _load_records(config)
        n, source = len(records.labels), records.source
        journal = rundir.create_run_files(
            paths, config.to_dict(), kind="merf", root_seed=opened.root_seed,
            seeded=config.seed is not None,
            facts={"dataset_source": source, "records": n, "noise_multiplier": z},
            ledger=new_ledger(config))
    release_path = os.path.join(paths.root, RELEASE_FILE)
    released = _read_release(release_path)
    attempt = len(journal.entries)
    if released is None or int(released["attempt"]) != attempt - 1:
        if attempt:
            # Every journaled release without its file was lost; still counted.
            journal.resume(entries_at_checkpoint=0, resumed_from_step=0)
            log(f"{attempt} earlier release(s) were spent but not written (a crash): "
                "spending again with fresh noise; the lost ones stay in the ledger")
        if records is None:
            records = _load_records(config)
            if len(records.labels) != n:
                raise rundir.RunDirError(
                    f"{paths.root} began on {n} training records but {source} now holds "
                    f"{len(records.labels)}: the data changed under the run; restore it or "
                    f"start over (--restart)")
        journal.ledger.spend(mechanism.event(z))
        journal.append(0, attempt, 1)            # durable before the noise exists
        total = mechanism.embedding_sum(features, records.images, records.labels,
                                        shape.num_classes)
        del records                              # nothing after this line reads them
        noisy = mechanism.release(total, z, seeds.numpy(Stream.DP_NOISE, attempt))
        del total
        _write_release(release_path, noisy, records=n, z=z, attempt=attempt,
                       features=features)
        log(f"released the embedding sum of {n} records ({features.dim} features x "
            f"{shape.num_classes} classes) with noise multiplier {z:.6g}: epsilon "
            f"{journal.ledger.epsilon().epsilon:.4g} at delta {config.delta:g} "
            f"({config.conversion.value})")
    else:
        noisy = _checked_release(released, release_path, records=n, z=z, features=features,
                                 classes=shape.num_classes)
        log(f"reusing the release in {release_path} (no new spend; the training records "
            f"are not read)")
    generator = build_generator(config, shape, seeds.integer(Stream.GENERATOR_INIT))
    losses = fit.fit_generator(generator, features, noisy / n, steps=config.fit_steps,
                               batch=config.fit_batch, learning_rate=config.learning_rate,
                               beta1=config.beta1, rng=seeds.numpy(Stream.LATENT), log=log,
                               log_every=config.log_every)
    with export.atomic_path(os.path.join(paths.root, GENERATOR_FILE)) as temporary:
        generator.save(temporary)
    render = generator_function(generator)
    _write_samples(render, config, shape, seeds, paths.root)
    classes = shape.num_classes
    rows, _ = sample_generator(render, shape, config.z_dim, classes * 10, seeds=seeds,
                               seed_path=(1,),
                               labels=np.repeat(np.arange(classes), 10))
    export.write_grid_png(os.path.join(paths.root, "samples.png"),
                          export.image_grid(rows, classes, 10),
                          title="DP-MERF samples (a row per class)")
    privacy = privacy_record(config, journal.ledger, z, n, source, journal.lost_queries)
    export.write_json(paths.privacy, privacy)
    report = {"kind": "merf", "records": n, "noise_multiplier": z,
              "epsilon": privacy["epsilon"], "fit_losses_first_last": [
                  losses[0] if losses else None, losses[-1] if losses else None],
              "num_samples": config.num_samples,
              "seconds": time.perf_counter() - started}
    export.write_json(report_path, report)
    log(f"done: {config.num_samples} samples in {paths.root} (epsilon "
        f"{privacy['epsilon']['epsilon']:.4g})")
    return report
