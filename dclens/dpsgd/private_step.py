"""The two parts of a private classifier's step: the classifier with its flat-gradient
plumbing (per-example gradients as one [B, P] matrix, SGD with momentum as explicit state),
and the method's noisy gradient with the event it spends.

:class:`NoisyGradient` draws its Gaussian noise from keys (DP_NOISE, attempt, step, part),
so a step redone after a crash noises afresh; the clipping and compression that bound its
sensitivity are :mod:`dclens.dpsgd.mechanisms` (DP-SGD, TopAgg) and :mod:`dclens.dpsgd.gep`.
"""

from __future__ import annotations

import numpy as np

from dclens.common.rng import SeedTree, Stream
from dclens.dpsgd import gep as gep_lib
from dclens.dpsgd import mechanisms, models, per_example
from dclens.dpsgd.config import DpsgdConfig


class Classifier:
    """The classifier, its flat-gradient plumbing and SGD with momentum (explicit state)."""

    def __init__(self, config: DpsgdConfig, image_shape, num_classes: int, seed: int):
        import tensorflow as tf

        self.tf = tf
        self.keras = models.sample_convnet(image_shape, num_classes, seed=seed,
                                           activation=config.activation)
        self.variables = self.keras.trainable_variables
        self.sizes = [int(np.prod(v.shape)) for v in self.variables]
        self.num_params = sum(self.sizes)
        self.velocity = np.zeros(self.num_params, np.float32)
        self.momentum = config.momentum
        #: The weights at the validation-chosen evaluation and its step (model.keras).
        self.chosen: list[np.ndarray] | None = None
        self.chosen_step: int | None = None
        pixels = tf.TensorSpec((None, *image_shape), tf.float32)
        self._per_example = tf.function(self._per_example_impl, input_signature=[
            pixels, tf.TensorSpec((None,), tf.int64)])

    def _loss(self, labels, logits):
        """Cross-entropy of each example (the model outputs logits)."""
        return self.tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)

    def _per_example_impl(self, images, labels):
        return per_example.per_example_gradients(self.keras, self._loss, images, labels)

    def per_example(self, images: np.ndarray, labels: np.ndarray):
        """[B, P] per-example gradients ([0, P] for an empty sample)."""
        tf = self.tf
        if len(labels) == 0:
            return tf.zeros((0, self.num_params), tf.float32)
        return self._per_example(tf.constant(images), tf.constant(labels, tf.int64))

    def apply(self, gradient: np.ndarray, learning_rate: float) -> None:
        """velocity = momentum * velocity + g; w -= learning_rate * velocity."""
        self.velocity = self.momentum * self.velocity + np.asarray(gradient, np.float32)
        start = 0
        for variable, size in zip(self.variables, self.sizes):
            piece = self.velocity[start:start + size].reshape(variable.shape)
            variable.assign_sub(learning_rate * piece)
            start += size

    def accuracy(self, images: np.ndarray, labels: np.ndarray, batch: int = 2000) -> float:
        if len(labels) == 0:
            return float("nan")
        hits = 0
        for start in range(0, len(labels), batch):
            logits = self.keras(images[start:start + batch], training=False)
            hits += int(np.sum(np.argmax(np.asarray(logits), axis=1)
                               == labels[start:start + batch]))
        return hits / len(labels)

    def remember_chosen(self, step: int) -> None:
        """Keeps a copy of the current weights as the validation-chosen ones."""
        self.chosen = [v.numpy().copy() for v in self.variables]
        self.chosen_step = step

    def use_chosen(self) -> None:
        """Sets the variables to the remembered chosen weights."""
        for variable, value in zip(self.variables, self.chosen):
            variable.assign(value)

    def state_arrays(self) -> dict[str, np.ndarray]:
        arrays = {f"w{i}": v.numpy() for i, v in enumerate(self.variables)}
        arrays["velocity"] = self.velocity
        if self.chosen is not None:
            arrays.update({f"chosen_w{i}": w for i, w in enumerate(self.chosen)})
        return arrays

    def load(self, load_array) -> None:
        """Restores the weights and momentum (with the checkpoint's ``load_array``)."""
        for i, variable in enumerate(self.variables):
            variable.assign(load_array(f"w{i}"))
        self.velocity = np.array(load_array("velocity"), np.float32)
        self._load_array = load_array

    def load_chosen(self, chosen_step: int | None) -> None:
        """After :meth:`load`: the chosen weights that checkpoint saved at ``chosen_step``
        (None: it saved none, as checkpoints before 2026-11-25)."""
        if chosen_step is not None:
            self.chosen = [np.array(self._load_array(f"chosen_w{i}"))
                           for i in range(len(self.variables))]
            self.chosen_step = chosen_step


class NoisyGradient:
    """The method's noisy gradient of one step, and the event it spends."""

    def __init__(self, config: DpsgdConfig, sigma: float, model: Classifier,
                 anchor_images: np.ndarray, anchor_labels: np.ndarray, seeds: SeedTree):
        self.config, self.model, self.seeds = config, model, seeds
        self.anchor_images, self.anchor_labels = anchor_images, anchor_labels
        if config.method.is_gep:
            self.gep = gep_lib.Gep(clip_embedding=config.clip_embedding,
                                   clip_residual=config.clip_residual, sigma=sigma,
                                   residual=config.method is mechanisms.Method.GEP)
            self.groups = gep_lib.group_sizes(model.num_params, config.num_groups)
        else:
            self.clipping = mechanisms.PrivateAggregation(
                method=config.method, clip=config.clip, sigma=sigma, topk=config.topk)

    def event(self, rate: float):
        if self.config.method.is_gep:
            return self.gep.event(rate)
        return self.clipping.event(rate)

    def noisy_gradient(self, per_example, *, step: int, attempt: int) -> np.ndarray:
        tf, config = self.model.tf, self.config
        expected = float(config.batch_size)
        if not config.method.is_gep:
            noise = tf.random.stateless_normal(
                (self.model.num_params,), seed=self.seeds.tf_seed(Stream.DP_NOISE, attempt,
                                                                   step, 0))
            return self.clipping.aggregate(per_example, expected_batch=expected,
                                           noise=noise).numpy()
        anchor_grads = self.model.per_example(self.anchor_images, self.anchor_labels)
        bases = gep_lib.anchor_bases(anchor_grads, self.groups, config.num_bases,
                                     rng=self.seeds.numpy(Stream.ANCHOR_BASIS, step))
        k = sum(b.shape[1] for b in bases)
        noise_embedding = tf.random.stateless_normal(
            (k,), seed=self.seeds.tf_seed(Stream.DP_NOISE, attempt, step, 0))
        noise_residual = tf.random.stateless_normal(
            (self.model.num_params,), seed=self.seeds.tf_seed(Stream.DP_NOISE, attempt, step, 1))
        return self.gep.aggregate(per_example, bases, expected_batch=expected,
                                  noise_embedding=noise_embedding,
                                  noise_residual=noise_residual).numpy()
