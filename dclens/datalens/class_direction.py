"""How much of the ensemble's class evidence reaches the generator (issue 39, lever 5).

The teachers, read as one classifier, know the classes (:mod:`dclens.datalens.class_signal`:
their summed logits are right on most held-out records), yet most samples miss their
label.  This diagnostic follows the class evidence through one round of the mechanism.
For a round's fake batch x (B images, labels y) and the T teachers D_i:

* each teacher's image gradient g_i = -dL_G,i/dx (what it votes on) and their mean m;
* the **class direction** c = -d/dx sum_b CE_b with
  CE_b = logsumexp_s S(x_b, y_b + s) - S(x_b, y_b) and S = sum_i D_i: the direction in
  which the ensemble's classifier favours each image's own label more (labels shifted
  together round the K classes, as in :mod:`~dclens.datalens.class_signal`, so the
  teachers' batch norm sees the same label histogram under every shift);
* the vote sum v (before the noise) and the released update u (after noise and
  threshold).

Per round it records the batch means of the per-image cosines cos(m, c), cos(v, c),
cos(u, c), cos(v, m) and cos(u, m).  cos(m, c) near 0 means the teachers' gradients carry
little of the class evidence in the first place; cos(m, c) clearly above cos(v, c) means
TopAgg's compression loses it; cos(u, c) / cos(u, m) against cos(m, c) tells whether the
noise and threshold lose the class evidence more than the rest of the gradient.

It reads the teachers' weights, which no mechanism releases, and writes functions of
them: only for screening runs on the tuning split (``--training_records tuning``).  It
reads only (no random draws, no state written), so a run with it trains bit for bit as
without it.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import tensorflow as tf

from dclens.common import export

#: The file a run's records go to.
FILE = "class_direction.json"


def class_direction(ensemble, weights: tf.Tensor, images: tf.Tensor, one_hot: tf.Tensor, *,
                    teacher_chunk: int = 25) -> tf.Tensor:
    """c = -d/dx sum_b CE_b (module docstring) [B, H, W, C].

    Computed in chunks of teachers: S is a sum over teachers, so with
    dCE/dS = softmax(S) - e_0 known after a forward pass over every chunk, c is the sum
    over chunks of -d/dx <dCE/dS, S_chunk>."""
    images = tf.convert_to_tensor(images, tf.float32)
    one_hot = tf.convert_to_tensor(one_hot, tf.float32)
    k = int(one_hot.shape[-1])
    labels = tf.argmax(one_hot, axis=-1, output_type=tf.int32)
    shifted = [tf.one_hot((labels + s) % k, k) for s in range(k)]

    def scores(w: tf.Tensor, x: tf.Tensor) -> tf.Tensor:        # [B, K], summed over w
        t = tf.shape(w)[0]
        tiled = tf.broadcast_to(x[None], tf.concat([[t], tf.shape(x)], 0))
        return tf.stack([tf.reduce_sum(ensemble.logits(
            w, tiled, tf.broadcast_to(h[None], tf.stack([t, tf.shape(h)[0], k]))), axis=0)
            for h in shifted], axis=-1)

    chunks = [weights[i:i + teacher_chunk] for i in range(0, int(weights.shape[0]),
                                                           teacher_chunk)]
    total = tf.add_n([scores(w, images) for w in chunks])
    d_scores = tf.nn.softmax(total, axis=-1) - tf.one_hot(tf.zeros_like(labels), k)
    direction = tf.zeros_like(images)
    for w in chunks:
        with tf.GradientTape() as tape:
            tape.watch(images)
            inner = tf.reduce_sum(d_scores * scores(w, images))
        direction -= tape.gradient(inner, images)
    return direction


def mean_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over images of cos(a_n, b_n) for [N, ...] arrays; images where either is zero
    (no direction) are left out; NaN if every image is."""
    a = np.asarray(a, np.float64).reshape(len(a), -1)
    b = np.asarray(b, np.float64).reshape(len(b), -1)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    kept = norms > 0
    if not kept.any():
        return float("nan")
    return float(np.mean(np.sum(a * b, axis=1)[kept] / norms[kept]))


class ClassDirectionLog:
    """A round observer (:class:`dclens.datalens.train.RoundObserver`) that records the
    cosines of the module docstring for round 0 of every ``every``-th step into
    ``<run>/class_direction.json`` (rewritten atomically; a resumed run replaces the records
    of the steps it redoes).  ``inner``: another observer told about every round first."""

    def __init__(self, lens_ref: list, run_dir: str, every: int, *, inner=None,
                 teacher_chunk: int = 25):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an integer >= 1, got {every!r}")
        self.lens_ref, self.every, self.inner = lens_ref, every, inner
        self.teacher_chunk = teacher_chunk
        self.path = os.path.join(run_dir, FILE)
        self.records: list[dict[str, Any]] = []
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as stream:
                self.records = json.load(stream)["records"]

    def round_released(self, step, round_index, images, one_hot, vote_sum, result) -> None:
        if self.inner is not None:
            self.inner.round_released(step, round_index, images, one_hot, vote_sum, result)
        if round_index != 0 or step % self.every:
            return
        lens = self.lens_ref[0]
        weights = tf.constant(lens.bank.weights)
        mean = sum(lens.ensemble.image_gradients(weights[i:i + self.teacher_chunk], images,
                                                 one_hot).numpy().sum(axis=0)
                   for i in range(0, int(weights.shape[0]), self.teacher_chunk)
                   ) / int(weights.shape[0])                               # [B, H, W, C]
        direction = class_direction(lens.ensemble, weights, images, one_hot,
                                    teacher_chunk=self.teacher_chunk).numpy()
        votes = np.asarray(vote_sum, np.float64).reshape(len(mean), -1)
        update = np.asarray(result.update, np.float64).reshape(len(mean), -1)
        record = {"step": int(step),
                  "mean_gradient_vs_class": mean_cosine(mean, direction),
                  "vote_vs_class": mean_cosine(votes, direction),
                  "update_vs_class": mean_cosine(update, direction),
                  "vote_vs_mean_gradient": mean_cosine(votes, mean),
                  "update_vs_mean_gradient": mean_cosine(update, mean),
                  "images": int(len(mean)), "teachers": int(weights.shape[0])}
        self.records = [r for r in self.records if r["step"] < step] + [record]
        export.write_json(self.path, {"description": __doc__.split("\n\n")[0],
                                      "records": self.records})
