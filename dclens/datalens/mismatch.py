"""Matching-aware teachers (beyond the paper; issue 39's lever 5, class conditioning).

A DataLens teacher is a conditional discriminator trained on matched real pairs
(x, y) against generator pairs (G(z, y), y).  Nothing in that loss asks it whether an
image shows its label: an image that looks like *some* garment scores as real under any
label, and the image gradient a teacher votes with carries little class evidence once the
samples look like clothing (``results/beyond/class-direction/``).  GAN-CLS (Reed et al.,
"Generative Adversarial Text to Image Synthesis", ICML 2016) adds a third kind of pair,
a real image under a wrong condition, scored as fake, so the discriminator must check the
match.

With ``TrainConfig.mismatch_negatives`` = m, the last m slots of every teacher's fake
half (batch size B) hold that teacher's own real records of the same slots under a wrong
label, in place of generator images:

    slot j in [B - m, B):  image x_ij (the teacher's j-th real record of the round),
                           label (y_ij + s_j) mod K,  s_j = 1 + ((step + j) mod (K - 1)),

so s_j runs over 1 .. K-1 and, over K - 1 consecutive steps, a record in slot j is shown
under every wrong label once.  The shift is a function of the step and the slot only (no
random draw, no data).  The other B - m fake slots are the generator's images, as
before, and the batch-norm statistics of the fake half are over all B of its slots.

**Privacy.** A teacher's merged batch still holds only records of its own partition (its
real half's records, shown again), so one record still changes one teacher; what the
teacher releases is still its image gradient on the public query batch, compressed by
TopAgg, whose per-teacher bound is what the noise is calibrated to.  The vote's
sensitivity and the ledger are unchanged (``tests/test_mismatch_negatives.py`` swaps one
teacher's records and checks that no other teacher's weights or image gradients change
and that the vote sum moves by at most TopAgg's 2 sqrt(k)).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def check_count(count: int, batch: int) -> int:
    """``count`` if 0 <= count <= ``batch`` (the teachers' per-half batch), else a
    ValueError that quotes both."""
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise ValueError(f"mismatch_negatives must be an integer >= 0 (0: the paper's "
                         f"teachers), got {count!r}")
    if count > batch:
        raise ValueError(f"mismatch_negatives={count} exceeds the teachers' batch of {batch} "
                         f"(min(batch_size, partition size)): at most {batch} of a teacher's "
                         f"fake slots can hold its own records; use a value <= {batch}")
    return int(count)


def wrong_labels(labels: np.ndarray, slots: np.ndarray, step: int,
                 num_classes: int) -> np.ndarray:
    """(labels + s) mod K with s = 1 + ((step + slot) mod (K - 1)): never the label itself.

    Args:
      labels: int [T, S] class indices of S slots of T teachers.
      slots: int [S], the slots' positions j in the batch.
      step: the generator step (the shift cycles with it).
      num_classes: K >= 2.
    """
    if num_classes < 2:
        raise ValueError(f"a wrong label needs at least 2 classes, got {num_classes}")
    shift = 1 + (int(step) + np.asarray(slots, np.int64)) % (num_classes - 1)
    return ((np.asarray(labels, np.int64) + shift[None, :]) % num_classes).astype(
        np.asarray(labels).dtype)


def with_mismatched_reals(real: tf.Tensor, real_labels: np.ndarray, fake: tf.Tensor,
                          count: int, *, step: int, num_classes: int
                          ) -> tuple[tf.Tensor, np.ndarray]:
    """The fake half with its last ``count`` slots replaced (module docstring).

    Args:
      real: float32 [T, B, H, W, C], each teacher's real batch.
      real_labels: int [T, B], their labels.
      fake: float32 [T, B, H, W, C], each teacher's generator images.
      count: m, 0 <= m <= B.
    Returns:
      (fake images [T, B, H, W, C], fake labels int [T, B]); ``count`` 0 returns
      ``fake`` and ``real_labels`` themselves.
    """
    batch = int(real_labels.shape[1])
    count = check_count(count, batch)
    if count == 0:
        return fake, real_labels
    keep = batch - count
    slots = np.arange(keep, batch)
    images = tf.concat([fake[:, :keep], tf.convert_to_tensor(real, tf.float32)[:, keep:]],
                       axis=1)
    labels = np.concatenate([real_labels[:, :keep],
                             wrong_labels(real_labels[:, keep:], slots, step, num_classes)],
                            axis=1)
    return images, labels
