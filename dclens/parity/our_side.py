"""dclens' side of a side-by-side run: a :class:`dclens.datalens.train.DataLens` that
replays the authors' recorded draws (:class:`ReplayDraws`) and is observed at the points
where their values are read (:class:`OurStep`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from dclens.datalens import topagg
from dclens.datalens.train import DataLens
from dclens.parity.authors_side import GENERATOR_NAMES, TEACHER_NAMES, TheirStep
from dclens.parity.config import SideBySideError


class ReplayDraws:
    """dclens' :class:`dclens.datalens.draws.Draws` that replays the authors' recorded draws."""

    def __init__(self, steps: list[TheirStep]):
        self.steps = steps

    def _step(self, step: int) -> TheirStep:
        if step >= len(self.steps):
            raise SideBySideError(f"dclens asked for step {step}'s draws but the authors' "
                                  f"run recorded {len(self.steps)} steps")
        return self.steps[step]

    def latent(self, step: int, shape: tuple[int, int]) -> tf.Tensor:
        return tf.constant(self._step(step).latent.reshape(shape))

    def query_labels(self, step, round_index, batch, num_classes) -> tf.Tensor:
        return tf.constant(self._step(step).query_labels.astype(np.int32))

    def sign_uniforms(self, step, round_index, first_teacher, grads, count) -> tf.Tensor:
        per_image = self._step(step).uniforms                     # B x [T_all, D]
        stacked = np.stack(per_image, axis=1)                     # [T_all, B, D]
        rows = stacked[first_teacher:first_teacher + grads.shape[0]]
        return topagg.uniforms_in_topk_order(grads, tf.constant(rows), count)

    def dp_noise(self, attempt, step, round_index, shape) -> tf.Tensor:
        return tf.constant(np.stack(self._step(step).noise).reshape(shape))


@dataclasses.dataclass
class OurStep:
    teacher_weights: dict[str, np.ndarray]
    teacher_loss: np.ndarray
    image_gradients: np.ndarray       # [T, B, D]
    vote_sum: np.ndarray              # [B, D]
    noisy_update: np.ndarray          # [B, D] in {-1, 0, 1}; without threshold noisy sum / k
    generator_weights: dict[str, np.ndarray]
    epsilon: float
    # dclens' functions applied to the authors' inputs of the same step:
    teacher_loss_their_weights: np.ndarray      # their trained teachers, this batch
    image_gradients_their_weights: np.ndarray   # their trained teachers, this query
    vote_sum_their_gradients: np.ndarray        # their image gradients and uniforms
    noisy_update_their_votes: np.ndarray        # their vote sums and noise


class Observer:
    """Reads what a dclens step computed at the points where the authors' values are read,
    and applies dclens' functions to the authors' inputs of the same step."""

    def __init__(self, lens_ref: list, theirs: list[TheirStep]):
        self.lens_ref = lens_ref
        self.theirs = theirs
        self.round: dict[str, Any] = {}

    def round_released(self, step, round_index, images, one_hot, vote_sum, result):
        lens: DataLens = self.lens_ref[0]
        theirs = self.theirs[step]
        weights = tf.constant(lens.bank.weights)
        grads = _flat(lens.ensemble.image_gradients(weights, images, one_hot))
        their_weights = lens.ensemble.layout.join(
            {n: tf.constant(theirs.teacher_weights[n]) for n in TEACHER_NAMES})
        on_their_weights = _flat(lens.ensemble.image_gradients(their_weights, images, one_hot))
        their_grads = np.stack(theirs.image_gradients, axis=1).reshape(grads.shape)
        losses = teacher_losses_on_batch(lens, step, [weights, their_weights])
        uniforms = None
        if lens.topagg.uniform_count(their_grads.shape[-1]):      # a stochastic sign
            uniforms = topagg.uniforms_in_topk_order(
                tf.constant(their_grads), tf.constant(np.stack(theirs.uniforms, axis=1)),
                lens.config.topagg.topk)
        their_votes = np.rint(np.stack(theirs.vote_sums)).astype(np.int32)
        self.round = dict(
            image_gradients=grads, vote_sum=vote_sum.numpy(),
            noisy_update=result.update.numpy(), teacher_loss=losses[0],
            teacher_loss_their_weights=losses[1],
            image_gradients_their_weights=on_their_weights,
            vote_sum_their_gradients=lens.topagg.vote_sum(tf.constant(their_grads),
                                                          uniforms=uniforms).numpy(),
            noisy_update_their_votes=lens.topagg.release(
                tf.constant(their_votes), noise=tf.constant(np.stack(theirs.noise))
            ).update.numpy())


def _flat(grads: tf.Tensor) -> np.ndarray:
    grads = grads.numpy()
    return grads.reshape(grads.shape[0], grads.shape[1], -1)


def teacher_loss_on_batch(lens: DataLens, step: int) -> np.ndarray:
    """Each teacher's discriminator loss on this step's real batch and its fake batch."""
    return teacher_losses_on_batch(lens, step, [tf.constant(lens.bank.weights)])[0]


def teacher_losses_on_batch(lens: DataLens, step: int,
                            weight_sets: list[tf.Tensor]) -> list[np.ndarray]:
    """:func:`teacher_loss_on_batch` with each of ``weight_sets`` (the bank's stacked
    layout) in place of the teachers' weights; the batches are rendered once."""
    columns = lens._slot_columns()
    records = lens.partitions[:, columns]
    labels = tf.one_hot(lens.labels[records], lens.shape.num_classes)
    z = lens.latent(step)
    fakes = tf.stack([lens.generate(z, labels[i]) for i in range(len(records))])
    real_images = tf.constant(lens.images[records])
    losses = []
    for weights in weight_sets:
        real = lens.ensemble.logits(weights, real_images, labels)
        fake = lens.ensemble.logits(weights, fakes, labels)
        losses.append((tf.reduce_mean(tf.nn.softplus(-real), axis=1)
                       + tf.reduce_mean(tf.nn.softplus(fake), axis=1)).numpy())
    return losses


def authors_state(lens: DataLens, theirs: TheirStep, step: int
                  ) -> tuple[dict[str, np.ndarray], Callable[[str], np.ndarray]]:
    """The authors' state after ``theirs`` (teachers, generator, both Adams) as dclens'
    checkpoint arrays (:meth:`DataLens.state_arrays` names), for
    :meth:`DataLens.load_state_arrays`."""
    layout = lens.ensemble.layout
    arrays = {
        "teachers_weights": layout.join({n: tf.constant(theirs.teacher_weights[n])
                                         for n in TEACHER_NAMES}).numpy(),
        "teachers_adam_m": layout.join({n: tf.constant(theirs.teacher_adam[n][0])
                                        for n in TEACHER_NAMES}).numpy(),
        "teachers_adam_v": layout.join({n: tf.constant(theirs.teacher_adam[n][1])
                                        for n in TEACHER_NAMES}).numpy(),
        "teachers_steps": np.array(lens.bank.steps),
    }
    values = {**theirs.generator_weights, **theirs.generator_statistics}
    for i, variable in enumerate(lens.generator.weights):
        arrays[f"generator_{i:03d}"] = values[variable.path]
    lens.student_optimizer.build(lens.generator.trainable_variables)
    for i, variable in enumerate(lens.student_optimizer.variables):
        name = variable.path.split("/", 1)[1]
        if name == "iteration":
            value = np.array(step + 1, variable.dtype)
        elif name == "learning_rate":
            value = variable.numpy()
        else:
            stem, moment = name.rsplit("_", 1)
            layer_weight = next(key for key in theirs.generator_adam
                                if key.replace("/", "_") == stem)
            value = theirs.generator_adam[layer_weight][0 if moment == "momentum" else 1]
        arrays[f"optimizer_{i:03d}"] = np.asarray(value)
    return arrays, arrays.__getitem__


def run_dclens(lens: DataLens, observer: Observer, steps: int,
               theirs: list[TheirStep] | None = None) -> list[OurStep]:
    """dclens' steps; with ``theirs`` (lockstep), each step from the authors' state after
    their previous step, so that every step compares one step's computation."""
    out = []
    for index in range(steps):
        if theirs is not None and index > 0:
            arrays, load = authors_state(lens, theirs[index - 1], index - 1)
            lens.load_state_arrays(load, list(arrays), index)
        lens.train_step()
        split = lens.ensemble.layout.split(tf.constant(lens.bank.weights))
        out.append(OurStep(
            teacher_weights={name: split[name].numpy() for name in TEACHER_NAMES},
            teacher_loss=observer.round["teacher_loss"],
            image_gradients=observer.round["image_gradients"],
            vote_sum=observer.round["vote_sum"],
            noisy_update=observer.round["noisy_update"],
            generator_weights={f"{layer}/{weight}":
                               getattr(lens.generator.get_layer(layer), weight).numpy()
                               for layer, weight in GENERATOR_NAMES},
            epsilon=lens.ledger.epsilon().epsilon,
            teacher_loss_their_weights=observer.round["teacher_loss_their_weights"],
            image_gradients_their_weights=observer.round["image_gradients_their_weights"],
            vote_sum_their_gradients=observer.round["vote_sum_their_gradients"],
            noisy_update_their_votes=observer.round["noisy_update_their_votes"]))
    return out
