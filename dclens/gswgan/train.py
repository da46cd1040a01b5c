"""GS-WGAN training (Chen et al., NeurIPS 2020): shards, warm-start, DP phase.

1. **Shards.** The training records are split into N_D disjoint shards by a random
   permutation of their indices (:func:`dclens.data.index_partition`): which shard a
   record joins does not depend on the data, so replacing one record changes one shard
   (a class-balanced split would move many records when one label changes).
2. **Warm-start** (not private, and it need not be): each discriminator D_i is trained
   by plain WGAN-GP against its *own* fresh generator on shard i alone for
   ``warm_iterations`` iterations; the generator is thrown away.  D_i then depends on
   shard i only -- which is what the DP phase's argument needs: a changed record changes
   one discriminator.  (A generator shared across discriminators here would carry every
   shard into every D_i and break that argument.)  ``warm_chunk`` pairs are trained
   together in one TensorFlow graph, as the teacher ensemble is.
3. **DP phase**, per iteration t: one discriminator k drawn uniformly (keyed by
   (attempt, t): a step redone after a crash samples afresh, as the accounting of two
   independently sampled spends requires); ``critic_iters`` WGAN-GP steps of D_k on
   shard k; the iteration's event is **spent and journaled**; then one generator step
   through the gradient sanitizer with noise keyed by (attempt, t)
   (:mod:`dclens.gswgan.steps`); the EMA generator follows.  With ``critic_updates`` =
   discard (default) the trained copy of D_k is dropped: the bank keeps the warm-start
   states, so the iteration depends on the data through shard k only, which the
   subsampled accounting needs (:mod:`dclens.gswgan.accounting`).  With keep (the
   released code) D_k goes back to the bank, and no epsilon of the run is proven.
4. **Release**: ``num_samples`` images from the EMA generator, labels uniform over
   classes (labels cost no privacy: they are drawn, not read).

The discriminator bank (:mod:`dclens.gswgan.discriminators`, ``discriminators.npy``: every D's weights and Adam state) is
written by the warm-start and then only read, unless ``critic_updates`` = keep, where it
is updated in place: after a crash it may then hold updates made in iterations after the
last checkpoint, which makes a resumed run differ from an uninterrupted one (and the run
is unproven anyway).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable

import numpy as np

from dclens import data
from dclens.common import export
from dclens.common.progress import progress_bar
from dclens.common.rng import SeedTree, Stream
from dclens.gswgan import accounting as gs_accounting
from dclens.gswgan import models, steps
from dclens.gswgan.config import (CHANGEABLE_ON_RESUME, IMPLIED_BY_OLDER_RUNS, GswganConfig,
                                  GswganConfigError)
from dclens.gswgan.discriminators import (GENERATOR, DiscriminatorBank, FaultHook, adam_for,
                                          new_discriminator, new_generator, real_batches,
                                          warm_start)
from dclens.privacy.accounting import HYPERPARAMETER_SELECTION, guarantee_label
from dclens.data import splits
from dclens.runs import rundir
from dclens.runs.checkpoint import CheckpointStore
from dclens.runs.journal import PrivacyJournal


def _no_hook(point: str, step: int) -> None:
    del point, step


def load_records(config: GswganConfig) -> data.LabeledImages:
    """The private records: the config's ``training_records`` of the training split (the
    first ``max_records`` of them if given)."""
    return splits.load_training_records(config.dataset, config.data_dir,
                                        config.training_records, limit=config.max_records)


def shard_indices(labels: np.ndarray, config: GswganConfig, seeds: SeedTree,
                  num_classes: int) -> np.ndarray:
    """[N_D, m] disjoint record indices, one row per discriminator (data-independent)."""
    del num_classes
    config.check_data(len(labels))
    return data.index_partition(len(labels), config.num_discriminators,
                                seed=seeds.integer(Stream.DATA_SPLIT))


class DpNetworks:
    """The generator, its EMA copy, and one discriminator slot the bank is swapped into."""

    def __init__(self, config: GswganConfig, seeds: SeedTree, num_classes: int,
                 sigma: float):
        import tensorflow as tf

        self.config, self.num_classes, self.sigma = config, num_classes, sigma
        self.generator = new_generator(config, num_classes, seeds, GENERATOR, 0)
        self.average = new_generator(config, num_classes, seeds, GENERATOR, 0)
        self.average.set_weights(self.generator.get_weights())
        self.discriminator = new_discriminator(config, num_classes, seeds, 0)
        self.g_opt = adam_for(config, self.generator)
        self.d_opt = adam_for(config, self.discriminator)
        self.critic_seed = seeds.tf_seed(Stream.CRITIC, 1)
        self.critic = tf.function(self._critic)
        self.generator_step = tf.function(self._generator_step)

    def _critic(self, real, labels, iteration):
        import tensorflow as tf

        fold = tf.random.experimental.stateless_fold_in
        config, batch = self.config, tf.shape(labels)[-1]
        seed = fold(self.critic_seed, iteration)
        loss = tf.constant(0.0)
        for c in range(config.critic_iters):
            critic_seed = fold(seed, c)
            z = steps.bernoulli_latent(fold(critic_seed, 0), batch, config.z_dim)
            alpha = tf.random.stateless_uniform((batch,), fold(critic_seed, 1))
            loss = steps.critic_step(self.generator, self.discriminator, self.d_opt,
                                     real[c], labels[c], z, alpha,
                                     lambda_gp=config.lambda_gp, drift=config.drift)
        return loss

    def _generator_step(self, z, labels, noise):
        import tensorflow as tf

        gradients, released = steps.private_generator_gradients(
            self.generator, self.discriminator, z, labels, clip=self.config.clip,
            sigma=self.sigma, noise=noise)
        self.g_opt.apply(gradients)
        return tf.reduce_mean(tf.norm(tf.reshape(released, (tf.shape(released)[0], -1)),
                                      axis=1))

    def follow(self, iteration: int) -> None:
        """The EMA generator after iteration ``iteration`` (counted from 0)."""
        steps.ema_update(self.average.trainable_variables, self.generator.trainable_variables,
                         iteration, self.config.ema_decay)
        for average, current in zip(self.average.non_trainable_variables,
                                    self.generator.non_trainable_variables):
            average.assign(current)

    def state_arrays(self) -> dict[str, np.ndarray]:
        arrays = {f"g{i}": w for i, w in enumerate(self.generator.get_weights())}
        arrays.update({f"ema{i}": w for i, w in enumerate(self.average.get_weights())})
        arrays.update({f"gopt{i}": a for i, a in enumerate(self.g_opt.state())})
        return arrays

    def load(self, load_array) -> None:
        count = len(self.generator.get_weights())
        self.generator.set_weights([load_array(f"g{i}") for i in range(count)])
        self.average.set_weights([load_array(f"ema{i}") for i in range(count)])
        self.g_opt.load([load_array(f"gopt{i}") for i in range(len(self.g_opt.state()))])


def sample(generator, num_samples: int, num_classes: int, z_dim: int, seeds: SeedTree, *,
           key: int = 0, batch: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """``num_samples`` images from ``generator``, labels as even over classes as the count
    allows (in class order), latent keyed by (SAMPLES, key, chunk)."""
    import tensorflow as tf

    labels = np.arange(num_samples, dtype=np.int64) * num_classes // num_samples
    images = []
    for i, start in enumerate(range(0, num_samples, batch)):
        y = labels[start:start + batch]
        z = steps.bernoulli_latent(seeds.tf_seed(Stream.SAMPLES, key, i), len(y), z_dim)
        images.append(np.asarray(generator(z, tf.constant(y), training=False)))
    return np.clip(np.concatenate(images), 0.0, 1.0).astype(np.float32), labels


def noise_multiplier_for(config: GswganConfig) -> float:
    if config.sigma is not None:
        return config.sigma
    return gs_accounting.calibrate_sigma(
        accounting=config.accounting, target_epsilon=config.target_eps,
        num_discriminators=config.num_discriminators, batch_size=config.batch_size,
        iterations=config.iterations, delta=config.delta, conversion=config.conversion)


@dataclasses.dataclass
class _Setup:
    """A run before its first DP iteration: its folder, keys, records, shards and mechanism."""

    run: rundir.OpenedRun           # the run directory: paths, resuming?, root seed
    seeds: SeedTree
    records: data.LabeledImages
    num_classes: int
    shards: np.ndarray
    sigma: float
    event: object                   # the dp_accounting event one iteration spends
    proven: bool
    facts: dict


def _set_up(config: GswganConfig, run_dir: str, *, restart: bool,
            log: Callable[[str], None]) -> _Setup:
    opened = rundir.open_run(config, run_dir, kind="gswgan", restart=restart,
                             changeable=CHANGEABLE_ON_RESUME, log=log,
                             implied=IMPLIED_BY_OLDER_RUNS)
    seeds = SeedTree(opened.root_seed)
    records = load_records(config)
    num_classes = records.spec.num_classes
    if records.spec.image_shape != models.IMAGE_SHAPE:
        raise GswganConfigError(f"dataset = {config.dataset!r} has images "
                                f"{records.spec.image_shape}; GS-WGAN's networks take 28x28x1")
    shards = shard_indices(records.labels, config, seeds, num_classes)
    sigma = noise_multiplier_for(config)
    event = config.accounting.iteration_event(
        sigma=sigma, num_discriminators=config.num_discriminators,
        batch_size=config.batch_size)
    proven = gs_accounting.is_proven(config.accounting, config.critic_updates)
    facts = {"sigma": sigma, "sigma_from": "given" if config.sigma is not None else
             f"calibrated to epsilon {config.target_eps} in {config.iterations} iterations "
             f"({config.accounting.value} accounting)",
             "records_per_shard": int(shards.shape[1]),
             "records_used": int(shards.size), "accounting": config.accounting.value,
             "accounting_proven": proven,
             "accounting_description": config.accounting.description,
             "critic_updates": config.critic_updates.value,
             "critic_updates_description": config.critic_updates.description}
    return _Setup(opened, seeds, records, num_classes, shards, sigma, event, proven, facts)


def _open_journal(config: GswganConfig, setup: _Setup, store: CheckpointStore) -> PrivacyJournal:
    """A fresh run's files and empty ledger, or a resumed run's journal."""
    if setup.run.resuming:
        return rundir.open_journal(setup.run.paths, store.latest())
    return rundir.create_run_files(
        setup.run.paths, config.to_dict(), kind="gswgan", root_seed=setup.run.root_seed,
        seeded=config.seed is not None,
        facts={"dataset_source": setup.records.source, **setup.facts},
        ledger=gs_accounting.new_ledger(delta=config.delta, conversion=config.conversion))


def _open_bank(config: GswganConfig, paths: rundir.RunPaths,
               nets: DpNetworks) -> DiscriminatorBank:
    bank_path, progress_path = paths.discriminators, paths.warm_start_progress
    if not os.path.exists(bank_path) and os.path.exists(progress_path):
        raise rundir.RunDirError(
            f"{bank_path} is missing but {progress_path} records warm-started "
            "discriminators: the bank cannot be rebuilt in place; pass --restart to start "
            "the run over")
    return DiscriminatorBank(bank_path, nets.discriminator, nets.d_opt,
                             config.num_discriminators,
                             create=not os.path.exists(bank_path))


class _DpPhase:
    """The DP iterations of one call: draw a discriminator, train its copy, spend and
    journal the iteration, release the sanitized gradient, log released values only."""

    def __init__(self, config: GswganConfig, setup: _Setup, nets: DpNetworks,
                 bank: DiscriminatorBank, journal: PrivacyJournal, store: CheckpointStore,
                 curves: list[dict], *, progress: bool, hook: FaultHook):
        import tensorflow as tf

        self.config, self.setup, self.nets, self.bank = config, setup, nets, bank
        self.journal, self.store, self.hook = journal, store, hook
        self.attempt = len(journal.lost)   # a resume that lost spends samples and noises anew
        self.curves = curves            # the released curve so far (a resume's included)
        self.writer = tf.summary.create_file_writer(setup.run.paths.logs)
        # The curve's name says which accounting produced it and whether it is proven.
        self.epsilon_tag = (f"gswgan/epsilon_{config.accounting.value}_critic_"
                            f"{config.critic_updates.value}"
                            f"{'' if setup.proven else '_NOT_proven'}")
        self.progress = progress
        self.bar = None

    def save_checkpoint(self, iteration: int, finished: bool) -> None:
        self.bank.flush()
        self.store.save(iteration, self.nets.state_arrays(),
                        {"root_seed": self.setup.run.root_seed, "curves": self.curves,
                         "journal_entries": len(self.journal.entries), "finished": finished},
                        before_commit=lambda: self.hook("checkpoint_before_commit", iteration))

    def run(self, start: int, already_finished: bool) -> str:
        """Iterations ``start`` .. the end; returns why they stopped ("iterations" or
        "budget").  The final checkpoint is written unless the run had finished before."""
        config, ledger = self.config, self.journal.ledger
        if self.progress:
            self.bar = progress_bar(config.iterations, initial=start, unit="it",
                                    desc="DP phase")
        stop_reason, iteration = "iterations", start
        for iteration in range(start, start if already_finished else config.iterations):
            if config.target_eps is not None and ledger.epsilon_after_event(
                    self.setup.event).epsilon > config.target_eps * (1 + 1e-9):
                stop_reason = "budget"
                break
            self._iteration(iteration)
        else:
            iteration = start if already_finished else config.iterations
        if not already_finished:
            self.save_checkpoint(iteration, True)
        if self.bar is not None:
            self.bar.close()
        return stop_reason

    def _iteration(self, iteration: int) -> None:
        import tensorflow as tf

        config, setup, nets, bank = self.config, self.setup, self.nets, self.bank
        seeds, ledger, attempt = setup.seeds, self.journal.ledger, self.attempt
        chosen = int(seeds.numpy(Stream.DISCRIMINATOR_CHOICE, attempt, iteration)
                     .integers(config.num_discriminators))
        bank.load(chosen, nets.discriminator, nets.d_opt)
        real, real_labels = real_batches(
            setup.records.images, setup.records.labels, setup.shards[chosen],
            seeds.numpy(Stream.BATCH, 2, attempt, iteration), config.critic_iters,
            config.batch_size)
        critic_loss = float(nets.critic(real, real_labels, np.int64(iteration)))
        before = ledger.queries
        ledger.spend(setup.event)
        self.journal.append(iteration, 0, ledger.queries - before)   # durable before the noise
        self.hook("after_spend", iteration)
        z = steps.bernoulli_latent(seeds.tf_seed(Stream.LATENT, iteration),
                                   config.batch_size, config.z_dim)
        y = steps.uniform_labels(seeds.tf_seed(Stream.QUERY_LABELS, iteration),
                                 config.batch_size, setup.num_classes)
        noise = tf.random.stateless_normal((config.batch_size, *models.IMAGE_SHAPE),
                                           seed=seeds.tf_seed(Stream.DP_NOISE, attempt,
                                                              iteration))
        released_norm = float(nets.generator_step(z, y, noise))
        nets.follow(iteration)
        if config.critic_updates is gs_accounting.CriticUpdates.KEEP:
            bank.store(chosen, nets.discriminator, nets.d_opt)
        done = iteration + 1
        self.hook("after_iteration", done)
        if self.bar is not None:
            self.bar.update(1)
        if done % config.log_every == 0 or done == config.iterations:
            self._log(done, released_norm, critic_loss)
        if done % config.checkpoint_every == 0 and done < config.iterations:
            self.save_checkpoint(done, False)

    def _log(self, done: int, released_norm: float, critic_loss: float) -> None:
        """The curves (report.json) hold only what is released or public; the critic loss
        is computed on the chosen shard's private records, so it goes to the owner's
        TensorBoard under private/ and never into the report."""
        import tensorflow as tf

        point = {"iteration": done, "released_norm": released_norm,
                 "epsilon": self.journal.ledger.epsilon().epsilon}
        self.curves.append(point)
        with self.writer.as_default(step=done):
            tf.summary.scalar("gswgan/released_norm", released_norm)
            tf.summary.scalar(self.epsilon_tag, point["epsilon"])
            tf.summary.scalar("private/critic_loss", critic_loss)
        self.writer.flush()
        if self.bar is not None:
            # Released quantities only: the critic loss (private, and a hint of which
            # discriminator was drawn, which amplification needs hidden) stays out.
            self.bar.set_postfix(eps=f"{point['epsilon']:.3f}", norm=f"{released_norm:.3f}")


def _privacy_record(config: GswganConfig, setup: _Setup, journal: PrivacyJournal,
                    stop_reason: str) -> dict:
    """``privacy.json``: the run's epsilon, its facts, and the other accounting beside it."""
    other = [a for a in gs_accounting.Accounting if a is not config.accounting][0]
    comparison = gs_accounting.epsilon(
        accounting=other, sigma=setup.sigma, num_discriminators=config.num_discriminators,
        batch_size=config.batch_size, iterations=len(journal.entries),
        delta=config.delta, conversion=config.conversion)
    return {"epsilon": journal.ledger.epsilon().to_dict(), "delta": config.delta,
            "adjacency": "replace one training example (one shard, so one "
                         "discriminator, of the N_D)", **setup.facts,
            "iterations_spent": len(journal.entries), "lost_iterations":
            sum(len(item["spends"]) for item in journal.lost),
            "event_per_iteration": repr(setup.event), "stop_reason": stop_reason,
            "reproducible_noise": config.seed is not None,
            "hyperparameter_selection": HYPERPARAMETER_SELECTION,
            "for_comparison": {"accounting": other.value,
                               "proven": gs_accounting.is_proven(other,
                                                                 config.critic_updates),
                               "epsilon": comparison,
                               "note": "the same spends under the other accounting"}}


def _release(config: GswganConfig, setup: _Setup, nets: DpNetworks, privacy: dict) -> None:
    """The samples (``samples.npz``) and their grid, from the EMA generator."""
    paths, seeds, num_classes = setup.run.paths, setup.seeds, setup.num_classes
    images, labels = sample(nets.average, config.num_samples, num_classes, config.z_dim,
                            seeds)
    export.write_samples_npz(paths.samples, images, labels)
    grid_images, _ = sample(nets.average, 10 * num_classes, num_classes, config.z_dim,
                            seeds, key=1)
    export.write_grid_png(paths.grid,
                          export.image_grid(grid_images, num_classes, 10),
                          title="GS-WGAN, " + guarantee_label(
                              privacy["epsilon"]["epsilon"], config.delta,
                              proven=setup.proven, seeded=config.seed is not None)
                          + f" ({config.accounting.value} accounting, critic updates "
                          f"{config.critic_updates.value})")


def train_gswgan(config: GswganConfig, run_dir: str, *, restart: bool = False,
                 progress: bool = True, log: Callable[[str], None] = print,
                 hook: FaultHook = _no_hook) -> dict:
    """Trains (or resumes) GS-WGAN in ``run_dir``; writes samples.npz and report.json.

    ``hook(point, value)`` is called at fault-injection points ("after_warm_chunk",
    "after_spend", "after_iteration", "checkpoint_before_commit") for crash tests.
    """
    started = time.perf_counter()
    setup = _set_up(config, run_dir, restart=restart, log=log)
    paths = setup.run.paths
    nets = DpNetworks(config, setup.seeds, setup.num_classes, setup.sigma)
    store = CheckpointStore(paths.checkpoints)
    journal = _open_journal(config, setup, store)
    bank = _open_bank(config, paths, nets)
    warm = warm_start(config, bank, setup.records.images, setup.records.labels, setup.shards,
                      setup.seeds, setup.num_classes, paths.warm_start_progress, log=log,
                      bar_enabled=progress, hook=hook)
    start, curves, already_finished = 0, [], False
    if setup.run.resuming:
        restored = rundir.restore_latest(
            store, journal, root_seed=setup.run.root_seed, seed_path=paths.seed,
            load=lambda checkpoint: nets.load(checkpoint.load_array))
        start, curves, already_finished = restored.start, restored.curves, restored.finished
        lost = restored.lost
        log(f"resuming at iteration {start}; the ledger counts {journal.queries} spends"
            + (f", {len(lost)} iterations of them lost in the crash (still counted)"
               if lost else ""))
    log(f"GS-WGAN: {config.num_discriminators} discriminators x {setup.shards.shape[1]} "
        f"records, B = {config.batch_size}, {config.iterations} iterations, sigma = "
        f"{setup.sigma:.4f} ({setup.facts['sigma_from']}), accounting: "
        f"{config.accounting.description}; critic updates: "
        f"{config.critic_updates.description}")
    phase = _DpPhase(config, setup, nets, bank, journal, store, curves, progress=progress,
                     hook=hook)
    stop_reason = phase.run(start, already_finished)
    privacy = _privacy_record(config, setup, journal, stop_reason)
    export.write_json(paths.privacy, privacy)
    _release(config, setup, nets, privacy)
    report = {"method": "gswgan", "dataset": config.dataset, "privacy": privacy,
              "warm_start": warm, "config": config.to_dict(), "curves": phase.curves,
              "samples": paths.samples, "seconds_this_call": time.perf_counter() - started}
    export.write_json(paths.report, report)
    comparison = privacy["for_comparison"]
    log(f"GS-WGAN: epsilon {privacy['epsilon']['epsilon']:.4f} at delta {config.delta:g} "
        f"({config.accounting.value} accounting, critic updates "
        f"{config.critic_updates.value}{'' if setup.proven else ', NOT proven'}; "
        f"{comparison['accounting']}: {comparison['epsilon']:.4f}); {config.num_samples} "
        f"samples in {paths.samples}")
    return report
