"""The adversarial-swap check of a teacher option's sensitivity, shared by the tests of
options that change what a teacher trains on or votes with (class guidance, matching-aware
teachers): neighbouring data sets that differ in every record of teacher 0 (noise images,
other labels) must, after one training step, leave every other teacher's weights and
image gradients bit-equal, and move the vote sum by at most TopAgg's charged sensitivity
2 sqrt(k) per image."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import tensorflow as tf

from conftest import synthetic_fashion_mnist
from dclens.datalens.config import BudgetConfig, DataLensConfig, TopAggConfig, TrainConfig
from dclens.datalens.train import DataLens, TeacherPlacement


def two_teacher_config(**train) -> DataLensConfig:
    """The tiny run the swap check is made for (2 teachers in one chunk, batch 4, top-k
    30, almost no budget limit) with ``train``'s settings over it."""
    return DataLensConfig(
        train=TrainConfig(**{"num_teachers": 2, "batch_size": 4, "d_step": 1,
                             "pretrain_teacher": 1, "z_dim": 8, "teacher_chunk": 2,
                             "num_samples": 10, **train}),
        topagg=TopAggConfig(topk=30, sigma=5.0, thresh=0.2, max_grad=1e-5),
        budget=BudgetConfig(max_eps=1e6))


def assert_a_swapped_teacher_moves_only_itself(config: DataLensConfig, *,
                                               ensemble: str = "fast") -> None:
    """Trains ``config`` (2 teachers in one chunk, 28x28x1, 10 classes) one step on 16
    synthetic records and on their neighbour, and checks the module docstring's claims."""
    first = synthetic_fashion_mnist(16)
    placement = TeacherPlacement(ensemble=ensemble)
    lens = DataLens(config, first, root_seed=4, placement=placement)
    rng = np.random.default_rng(9)
    images, labels = first.images.copy(), first.labels.copy()
    swapped = lens.partitions[0]
    images[swapped] = rng.uniform(size=images[swapped].shape).astype(images.dtype)
    labels[swapped] = (labels[swapped] + 1 + rng.integers(0, 9, len(swapped))) % 10
    neighbour = dataclasses.replace(first, images=images, labels=labels)
    other = DataLens(config, neighbour, root_seed=4, partitions=lens.partitions,
                     placement=placement)
    lens.train_step()
    other.train_step()
    w_a, w_b = np.array(lens.bank.weights), np.array(other.bank.weights)
    assert np.any(w_a[0] != w_b[0])
    np.testing.assert_array_equal(w_a[1:], w_b[1:])

    query = tf.constant(rng.uniform(size=(4, 28, 28, 1)).astype(np.float32))
    query_labels = tf.one_hot(rng.integers(0, 10, 4), 10)
    g_a = lens.ensemble.image_gradients(tf.constant(w_a), query, query_labels).numpy()
    g_b = other.ensemble.image_gradients(tf.constant(w_b), query, query_labels).numpy()
    assert np.any(g_a[0] != g_b[0])
    np.testing.assert_array_equal(g_a[1:], g_b[1:])
    uniforms = tf.constant(rng.uniform(size=(2, 4, lens.topagg.uniform_count(784))),
                           tf.float32)
    votes_a = lens.topagg.vote_sum(tf.constant(g_a), uniforms=uniforms).numpy()
    votes_b = lens.topagg.vote_sum(tf.constant(g_b), uniforms=uniforms).numpy()
    moved = np.sqrt(((votes_a.astype(np.float64) - votes_b) ** 2).sum(axis=-1))
    topk = config.topagg.topk
    assert moved.max() > 0
    assert moved.max() <= 2 * math.sqrt(topk) + 1e-9
    assert lens.topagg.sensitivity == 2 * math.sqrt(topk)
