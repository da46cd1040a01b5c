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

The discriminator bank (``discriminators.npy``: every D's weights and Adam state) is
written by the warm-start and then only read, unless ``critic_updates`` = keep, where it
is updated in place: after a crash it may then hold updates made in iterations after the
last checkpoint, which makes a resumed run differ from an uninterrupted one (and the run
is unproven anyway).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Callable

import numpy as np

from dclens import data
from dclens.common import export
from dclens.runs import rundir
from dclens.privacy.accounting import HYPERPARAMETER_SELECTION, guarantee_label
from dclens.runs.checkpoint import CheckpointStore
from dclens.gswgan import accounting as gs_accounting
from dclens.gswgan import models, steps
from dclens.gswgan.config import (CHANGEABLE_ON_RESUME, IMPLIED_BY_OLDER_RUNS, GswganConfig,
                                  GswganConfigError)
from dclens.common.rng import SeedTree, Stream
from dclens.common.progress import progress_bar

FaultHook = Callable[[str, int], None]

#: Roles in the model-initialisation key (Stream.MODEL_INIT, role, member, layer).
_DISCRIMINATOR, _WARM_GENERATOR, _GENERATOR = 0, 1, 2


def _no_hook(point: str, step: int) -> None:
    del point, step


def load_records(config: GswganConfig) -> data.LabeledImages:
    return data.load_dataset(config.dataset, config.data_dir, split="train",
                             limit=config.max_records)


def shard_indices(labels: np.ndarray, config: GswganConfig, seeds: SeedTree,
                  num_classes: int) -> np.ndarray:
    """[N_D, m] disjoint record indices, one row per discriminator (data-independent)."""
    del num_classes
    config.check_data(len(labels))
    return data.index_partition(len(labels), config.num_discriminators,
                                seed=seeds.integer(Stream.DATA_SPLIT))


def new_generator(config: GswganConfig, num_classes: int, seeds: SeedTree, role: int,
                  member: int) -> models.Generator:
    layer_seed = {name: seeds.integer(Stream.MODEL_INIT, role, member, i)
                  for i, name in enumerate(models.GENERATOR_LAYERS)}
    return models.Generator(model_dim=config.model_dim, z_dim=config.z_dim,
                            num_classes=num_classes, seeds=layer_seed)


def new_discriminator(config: GswganConfig, num_classes: int, seeds: SeedTree,
                      member: int) -> models.Discriminator:
    layer_seed = {name: seeds.integer(Stream.MODEL_INIT, _DISCRIMINATOR, member, i)
                  for i, name in enumerate(models.DISCRIMINATOR_LAYERS)}
    return models.Discriminator(model_dim=config.model_dim, num_classes=num_classes,
                                seeds=layer_seed)


def _adam(config: GswganConfig, network) -> steps.Adam:
    return steps.Adam(network.trainable_variables, learning_rate=config.learning_rate,
                      beta1=config.beta1, beta2=config.beta2)


def real_batches(images: np.ndarray, labels: np.ndarray, shard: np.ndarray,
                 rng: np.random.Generator, count: int, batch: int):
    """``count`` batches of ``batch`` records of one shard (without replacement inside a
    batch when the shard is large enough): [count, B, ...] images and [count, B] labels."""
    picks = np.stack([rng.choice(shard, size=batch, replace=len(shard) < batch)
                      for _ in range(count)])
    return images[picks], labels[picks]


class DiscriminatorBank:
    """Every discriminator's weights (spectral-norm vectors included) and Adam state, one
    float32 row each, in a memory-mapped ``.npy`` file."""

    def __init__(self, path: str, discriminator, optimizer: steps.Adam, count: int, *,
                 create: bool):
        self.path = path
        self.shapes = [tuple(w.shape) for w in discriminator.get_weights()] + \
            [tuple(a.shape) for a in optimizer.state()]
        self.width = int(sum(np.prod(s) for s in self.shapes))
        if create:
            needed = 4 * self.width * count
            free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
            if needed > free:
                raise OSError(f"the discriminator bank needs {needed / 2**30:.1f} GiB for "
                              f"{count} discriminators but {free / 2**30:.1f} GiB are free "
                              f"under {os.path.dirname(path)}: free space, use another "
                              f"run directory, or lower --num_discriminators/--model_dim")
            self.rows = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32,
                                                  shape=(count, self.width))
        else:
            self.rows = np.load(path, mmap_mode="r+")
            if self.rows.shape != (count, self.width):
                raise rundir.RunDirError(
                    f"{path} holds {self.rows.shape}, expected {(count, self.width)}: the "
                    f"bank does not belong to this run; pass --restart")

    def _split(self, row: np.ndarray) -> list[np.ndarray]:
        arrays, start = [], 0
        for shape in self.shapes:
            size = int(np.prod(shape))
            arrays.append(np.asarray(row[start:start + size]).reshape(shape))
            start += size
        return arrays

    def store(self, index: int, discriminator, optimizer: steps.Adam) -> None:
        self.rows[index] = np.concatenate(
            [a.reshape(-1) for a in (*discriminator.get_weights(), *optimizer.state())])

    def load(self, index: int, discriminator, optimizer: steps.Adam) -> None:
        arrays = self._split(self.rows[index])
        count = len(discriminator.get_weights())
        discriminator.set_weights(arrays[:count])
        optimizer.load(arrays[count:])

    def flush(self) -> None:
        self.rows.flush()


class _WarmPairs:
    """``size`` independent (generator, discriminator) pairs, WGAN-GP trained together in
    one graph; each pair only ever sees its own shard's batches.  The graph is traced once
    and reused: :meth:`reset` loads the next members' fresh initial weights (each from its
    own keys) and zeroes their optimisers."""

    def __init__(self, config: GswganConfig, size: int, num_classes: int):
        import tensorflow as tf

        self.config, self.size, self.num_classes = config, size, num_classes
        template = SeedTree(0)
        self.generators = [new_generator(config, num_classes, template, _WARM_GENERATOR, k)
                           for k in range(size)]
        self.discriminators = [new_discriminator(config, num_classes, template, k)
                               for k in range(size)]
        self.g_opt = [_adam(config, g) for g in self.generators]
        self.d_opt = [_adam(config, d) for d in self.discriminators]
        self.step = tf.function(self._step)

    def reset(self, members: list[int], seeds: SeedTree):
        """Fresh pairs for ``members`` (len == size); returns their critic base seeds."""
        import tensorflow as tf

        for k, member in enumerate(members):
            self.generators[k].set_weights(new_generator(
                self.config, self.num_classes, seeds, _WARM_GENERATOR, member).get_weights())
            self.discriminators[k].set_weights(new_discriminator(
                self.config, self.num_classes, seeds, member).get_weights())
            for optimizer in (self.g_opt[k], self.d_opt[k]):
                optimizer.load([np.zeros(a.shape, np.float32) for a in optimizer.state()])
        return tf.stack([seeds.tf_seed(Stream.CRITIC, 0, m) for m in members])

    def _step(self, real, labels, base_seeds, iteration):
        import tensorflow as tf

        config = self.config
        fold = tf.random.experimental.stateless_fold_in
        batch = tf.shape(labels)[-1]
        for k in range(self.size):
            seed = fold(base_seeds[k], iteration)
            for c in range(config.critic_iters):
                critic_seed = fold(seed, c)
                z = steps.bernoulli_latent(fold(critic_seed, 0), batch, config.z_dim)
                alpha = tf.random.stateless_uniform((batch,), fold(critic_seed, 1))
                steps.critic_step(self.generators[k], self.discriminators[k], self.d_opt[k],
                                  real[k, c], labels[k, c], z, alpha,
                                  lambda_gp=config.lambda_gp, drift=config.drift)
            g_seed = fold(seed, config.critic_iters)
            z = steps.bernoulli_latent(fold(g_seed, 0), batch, config.z_dim)
            y = steps.uniform_labels(fold(g_seed, 1), batch, self.num_classes)
            self.g_opt[k].apply(steps.plain_generator_gradients(
                self.generators[k], self.discriminators[k], z, y))


def warm_start(config: GswganConfig, bank: DiscriminatorBank, images, labels, shards,
               seeds: SeedTree, num_classes: int, progress_path: str, *, log, bar_enabled,
               hook: FaultHook) -> dict:
    """Warm-starts every discriminator not yet done (resumable per chunk); each stored
    with a fresh Adam state, as GS-WGAN starts the DP phase.  Returns what was run."""
    done = 0
    if os.path.exists(progress_path):
        with open(progress_path, encoding="utf-8") as stream:
            done = int(json.load(stream)["done"])
    total, started = config.num_discriminators, time.perf_counter()
    bar = None
    if bar_enabled and done < total:
        bar = progress_bar(total, initial=done, unit="D", desc="warm-start")
    graphs: dict[int, _WarmPairs] = {}          # one traced graph per chunk size
    while done < total:
        members = list(range(done, min(total, done + config.warm_chunk)))
        if len(members) not in graphs:
            graphs[len(members)] = _WarmPairs(config, len(members), num_classes)
        pairs = graphs[len(members)]
        base_seeds = pairs.reset(members, seeds)
        rngs = [seeds.numpy(Stream.BATCH, 1, m) for m in members]
        for iteration in range(config.warm_iterations):
            real, real_labels = zip(*(real_batches(images, labels, shards[m], rng,
                                                   config.critic_iters, config.batch_size)
                                      for m, rng in zip(members, rngs)))
            pairs.step(np.stack(real), np.stack(real_labels), base_seeds,
                       np.int64(iteration))
        for m, discriminator in zip(members, pairs.discriminators):
            bank.store(m, discriminator, _adam(config, discriminator))
        bank.flush()
        done = members[-1] + 1
        export.write_json(progress_path, {"done": done})
        hook("after_warm_chunk", done)
        if bar is not None:
            bar.update(len(members))
    if bar is not None:
        bar.close()
    seconds = time.perf_counter() - started
    if config.warm_iterations:
        log(f"warm-start: {total} discriminators x {config.warm_iterations} iterations "
            f"({seconds:.0f} s this call)")
    return {"discriminators": total, "iterations_each": config.warm_iterations,
            "chunk": config.warm_chunk, "seconds_this_call": seconds}


class _DpNetworks:
    """The generator, its EMA copy, and one discriminator slot the bank is swapped into."""

    def __init__(self, config: GswganConfig, seeds: SeedTree, num_classes: int,
                 sigma: float):
        import tensorflow as tf

        self.config, self.num_classes, self.sigma = config, num_classes, sigma
        self.generator = new_generator(config, num_classes, seeds, _GENERATOR, 0)
        self.average = new_generator(config, num_classes, seeds, _GENERATOR, 0)
        self.average.set_weights(self.generator.get_weights())
        self.discriminator = new_discriminator(config, num_classes, seeds, 0)
        self.g_opt = _adam(config, self.generator)
        self.d_opt = _adam(config, self.discriminator)
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


def train_gswgan(config: GswganConfig, run_dir: str, *, restart: bool = False,
                 progress: bool = True, log: Callable[[str], None] = print,
                 hook: FaultHook = _no_hook) -> dict:
    """Trains (or resumes) GS-WGAN in ``run_dir``; writes samples.npz and report.json.

    ``hook(point, value)`` is called at fault-injection points ("after_warm_chunk",
    "after_spend", "after_iteration", "checkpoint_before_commit") for crash tests.
    """
    import tensorflow as tf

    started = time.perf_counter()
    opened = rundir.open_run(config, run_dir, kind="gswgan", restart=restart,
                             changeable=CHANGEABLE_ON_RESUME, log=log,
                             implied=IMPLIED_BY_OLDER_RUNS)
    paths, resuming, root_seed = opened.paths, opened.resuming, opened.root_seed
    seeds = SeedTree(root_seed)
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
    nets = _DpNetworks(config, seeds, num_classes, sigma)
    bank_path = os.path.join(paths.root, "discriminators.npy")
    store = CheckpointStore(paths.checkpoints)
    if not resuming:
        journal = rundir.create_run_files(
            paths, config.to_dict(), kind="gswgan", root_seed=root_seed,
            seeded=config.seed is not None, facts={"dataset_source": records.source, **facts},
            ledger=gs_accounting.new_ledger(delta=config.delta, conversion=config.conversion))
    else:
        journal = rundir.open_journal(paths, store.latest())
    progress_path = os.path.join(paths.root, "warmstart.json")
    if not os.path.exists(bank_path) and os.path.exists(progress_path):
        raise rundir.RunDirError(
            f"{bank_path} is missing but {progress_path} records warm-started "
            "discriminators: the bank cannot be rebuilt in place; pass --restart to start "
            "the run over")
    bank = DiscriminatorBank(bank_path, nets.discriminator, nets.d_opt,
                             config.num_discriminators,
                             create=not os.path.exists(bank_path))
    warm = warm_start(config, bank, records.images, records.labels, shards, seeds,
                      num_classes, progress_path, log=log,
                      bar_enabled=progress, hook=hook)
    start, curves, already_finished = 0, [], False
    if resuming:
        restored = rundir.restore_latest(
            store, journal, root_seed=root_seed, seed_path=paths.seed,
            load=lambda checkpoint: nets.load(checkpoint.load_array))
        start, curves, already_finished = restored.start, restored.curves, restored.finished
        lost = restored.lost
        log(f"resuming at iteration {start}; the ledger counts {journal.queries} spends"
            + (f", {len(lost)} iterations of them lost in the crash (still counted)"
               if lost else ""))
    ledger = journal.ledger
    attempt = len(journal.lost)           # a resume that lost spends samples and noises anew
    log(f"GS-WGAN: {config.num_discriminators} discriminators x {shards.shape[1]} records, "
        f"B = {config.batch_size}, {config.iterations} iterations, sigma = {sigma:.4f} "
        f"({facts['sigma_from']}), accounting: {config.accounting.description}; critic "
        f"updates: {config.critic_updates.description}")
    writer = tf.summary.create_file_writer(paths.logs)
    # The curve's name says which accounting produced it and whether it is proven.
    epsilon_tag = (f"gswgan/epsilon_{config.accounting.value}_critic_"
                   f"{config.critic_updates.value}{'' if proven else '_NOT_proven'}")
    bar = None
    if progress:
        bar = progress_bar(config.iterations, initial=start, unit="it", desc="DP phase")

    def save_checkpoint(iteration: int, finished: bool) -> None:
        bank.flush()
        store.save(iteration, nets.state_arrays(),
                   {"root_seed": root_seed, "curves": curves,
                    "journal_entries": len(journal.entries), "finished": finished},
                   before_commit=lambda: hook("checkpoint_before_commit", iteration))

    stop_reason, iteration = "iterations", start
    for iteration in range(start, start if already_finished else config.iterations):
        if config.target_eps is not None and \
                ledger.epsilon_after_event(event).epsilon > config.target_eps * (1 + 1e-9):
            stop_reason = "budget"
            break
        chosen = int(seeds.numpy(Stream.DISCRIMINATOR_CHOICE, attempt, iteration)
                     .integers(config.num_discriminators))
        bank.load(chosen, nets.discriminator, nets.d_opt)
        real, real_labels = real_batches(
            records.images, records.labels, shards[chosen],
            seeds.numpy(Stream.BATCH, 2, attempt, iteration), config.critic_iters,
            config.batch_size)
        critic_loss = float(nets.critic(real, real_labels, np.int64(iteration)))
        before = ledger.queries
        ledger.spend(event)
        journal.append(iteration, 0, ledger.queries - before)   # durable before the noise
        hook("after_spend", iteration)
        z = steps.bernoulli_latent(seeds.tf_seed(Stream.LATENT, iteration),
                                   config.batch_size, config.z_dim)
        y = steps.uniform_labels(seeds.tf_seed(Stream.QUERY_LABELS, iteration),
                                 config.batch_size, num_classes)
        noise = tf.random.stateless_normal((config.batch_size, *models.IMAGE_SHAPE),
                                           seed=seeds.tf_seed(Stream.DP_NOISE, attempt,
                                                              iteration))
        released_norm = float(nets.generator_step(z, y, noise))
        nets.follow(iteration)
        if config.critic_updates is gs_accounting.CriticUpdates.KEEP:
            bank.store(chosen, nets.discriminator, nets.d_opt)
        done = iteration + 1
        hook("after_iteration", done)
        if bar is not None:
            bar.update(1)
        if done % config.log_every == 0 or done == config.iterations:
            # The curves (report.json) hold only what is released or public; the critic
            # loss is computed on the chosen shard's private records, so it goes to the
            # owner's TensorBoard under private/ and never into the report.
            point = {"iteration": done, "released_norm": released_norm,
                     "epsilon": ledger.epsilon().epsilon}
            curves.append(point)
            with writer.as_default(step=done):
                tf.summary.scalar("gswgan/released_norm", released_norm)
                tf.summary.scalar(epsilon_tag, point["epsilon"])
                tf.summary.scalar("private/critic_loss", critic_loss)
            writer.flush()
            if bar is not None:
                # Released quantities only: the critic loss (private, and a hint of which
                # discriminator was drawn, which amplification needs hidden) stays out.
                bar.set_postfix(eps=f"{point['epsilon']:.3f}", norm=f"{released_norm:.3f}")
        if done % config.checkpoint_every == 0 and done < config.iterations:
            save_checkpoint(done, False)
    else:
        iteration = start if already_finished else config.iterations
    if not already_finished:
        save_checkpoint(iteration, True)
    if bar is not None:
        bar.close()
    epsilon = ledger.epsilon()
    other = [a for a in gs_accounting.Accounting if a is not config.accounting][0]
    comparison = gs_accounting.epsilon(
        accounting=other, sigma=sigma, num_discriminators=config.num_discriminators,
        batch_size=config.batch_size, iterations=len(journal.entries),
        delta=config.delta, conversion=config.conversion)
    privacy = {"epsilon": epsilon.to_dict(), "delta": config.delta,
               "adjacency": "replace one training example (one shard, so one "
                            "discriminator, of the N_D)", **facts,
               "iterations_spent": len(journal.entries), "lost_iterations":
               sum(len(item["spends"]) for item in journal.lost),
               "event_per_iteration": repr(event), "stop_reason": stop_reason,
               "reproducible_noise": config.seed is not None,
               "hyperparameter_selection": HYPERPARAMETER_SELECTION,
               "for_comparison": {"accounting": other.value,
                                  "proven": gs_accounting.is_proven(other,
                                                                    config.critic_updates),
                                  "epsilon": comparison,
                                  "note": "the same spends under the other accounting"}}
    export.write_json(paths.privacy, privacy)
    images, labels = sample(nets.average, config.num_samples, num_classes, config.z_dim,
                            seeds)
    samples_path = paths.samples
    export.write_samples_npz(samples_path, images, labels)
    grid_images, _ = sample(nets.average, 10 * num_classes, num_classes, config.z_dim,
                            seeds, key=1)
    export.write_grid_png(paths.grid,
                          export.image_grid(grid_images, num_classes, 10),
                          title="GS-WGAN, " + guarantee_label(
                              epsilon.epsilon, config.delta, proven=proven,
                              seeded=config.seed is not None)
                          + f" ({config.accounting.value} accounting, critic updates "
                          f"{config.critic_updates.value})")
    report = {"method": "gswgan", "dataset": config.dataset, "privacy": privacy,
              "warm_start": warm, "config": config.to_dict(), "curves": curves,
              "samples": samples_path, "seconds_this_call": time.perf_counter() - started}
    export.write_json(paths.report, report)
    log(f"GS-WGAN: epsilon {epsilon.epsilon:.4f} at delta {config.delta:g} "
        f"({config.accounting.value} accounting, critic updates "
        f"{config.critic_updates.value}{'' if proven else ', NOT proven'}; {other.value}: "
        f"{comparison:.4f}); {config.num_samples} samples in {samples_path}")
    return report
