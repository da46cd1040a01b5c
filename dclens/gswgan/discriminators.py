"""GS-WGAN's discriminators: their construction, the bank that holds them all, and the
non-private warm-start that trains each on its own shard.

Every network is built from its own keys (Stream.MODEL_INIT, role, member, layer), so no
two layers or members share an initial draw.  The warm-start trains each discriminator
D_i against its *own* throw-away generator on shard i alone, so D_i depends on shard i
only (which the DP phase's argument needs); ``warm_chunk`` such pairs are trained together
in one TensorFlow graph.  The bank (``discriminators.npy``) is one float32 row per
discriminator: weights, spectral-norm vectors and Adam state.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Callable

import numpy as np

from dclens.common import export
from dclens.common.progress import progress_bar
from dclens.common.rng import SeedTree, Stream
from dclens.gswgan import models, steps
from dclens.gswgan.config import GswganConfig
from dclens.runs.output_checks import RunDirError

FaultHook = Callable[[str, int], None]

#: Roles in the model-initialisation key (Stream.MODEL_INIT, role, member, layer).
DISCRIMINATOR, WARM_GENERATOR, GENERATOR = 0, 1, 2


def new_generator(config: GswganConfig, num_classes: int, seeds: SeedTree, role: int,
                  member: int) -> models.Generator:
    layer_seed = {name: seeds.integer(Stream.MODEL_INIT, role, member, i)
                  for i, name in enumerate(models.GENERATOR_LAYERS)}
    return models.Generator(model_dim=config.model_dim, z_dim=config.z_dim,
                            num_classes=num_classes, seeds=layer_seed)


def new_discriminator(config: GswganConfig, num_classes: int, seeds: SeedTree,
                      member: int) -> models.Discriminator:
    layer_seed = {name: seeds.integer(Stream.MODEL_INIT, DISCRIMINATOR, member, i)
                  for i, name in enumerate(models.DISCRIMINATOR_LAYERS)}
    return models.Discriminator(model_dim=config.model_dim, num_classes=num_classes,
                                seeds=layer_seed)


def adam_for(config: GswganConfig, network) -> steps.Adam:
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
                raise RunDirError(
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


class WarmPairs:
    """``size`` independent (generator, discriminator) pairs, WGAN-GP trained together in
    one graph; each pair only ever sees its own shard's batches.  The graph is traced once
    and reused: :meth:`reset` loads the next members' fresh initial weights (each from its
    own keys) and zeroes their optimisers."""

    def __init__(self, config: GswganConfig, size: int, num_classes: int):
        import tensorflow as tf

        self.config, self.size, self.num_classes = config, size, num_classes
        template = SeedTree(0)
        self.generators = [new_generator(config, num_classes, template, WARM_GENERATOR, k)
                           for k in range(size)]
        self.discriminators = [new_discriminator(config, num_classes, template, k)
                               for k in range(size)]
        self.g_opt = [adam_for(config, g) for g in self.generators]
        self.d_opt = [adam_for(config, d) for d in self.discriminators]
        self.step = tf.function(self._step)

    def reset(self, members: list[int], seeds: SeedTree):
        """Fresh pairs for ``members`` (len == size); returns their critic base seeds."""
        import tensorflow as tf

        for k, member in enumerate(members):
            self.generators[k].set_weights(new_generator(
                self.config, self.num_classes, seeds, WARM_GENERATOR, member).get_weights())
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
    graphs: dict[int, WarmPairs] = {}          # one traced graph per chunk size
    while done < total:
        members = list(range(done, min(total, done + config.warm_chunk)))
        if len(members) not in graphs:
            graphs[len(members)] = WarmPairs(config, len(members), num_classes)
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
            bank.store(m, discriminator, adam_for(config, discriminator))
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
