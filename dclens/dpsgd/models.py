"""Classifiers for private training (no batch norm, no dropout: per-example gradients must
not mix examples and the forward pass is deterministic)."""

from __future__ import annotations

import numpy as np


def sample_convnet(image_shape: tuple[int, int, int] = (28, 28, 1), num_classes: int = 10,
                   *, seed: int, activation: str = "relu"):
    """Opacus' MNIST example network (DataLens App. A.2.1): conv 16 8x8/2 (padding 3),
    ReLU, max-pool 2/1, conv 32 4x4/2, ReLU, max-pool 2/1, dense 32, ReLU, dense classes.

    Every initialiser has its own seed derived from ``seed``. ``activation``: "relu" (the
    Opacus example) or "tanh" (a tempered sigmoid, Papernot et al. 2021, better under DP).
    """
    import keras

    if activation not in ("relu", "tanh"):
        raise ValueError(f"activation must be 'relu' or 'tanh', got {activation!r}")
    seeds = [int(s) for s in np.random.SeedSequence(seed).generate_state(4, np.uint32) >> 1]
    init = [keras.initializers.GlorotUniform(seed=s) for s in seeds]
    layers = keras.layers
    return keras.Sequential([
        keras.Input(shape=image_shape),
        layers.ZeroPadding2D(3),
        layers.Conv2D(16, 8, strides=2, activation=activation, kernel_initializer=init[0]),
        layers.MaxPooling2D(2, strides=1),
        layers.Conv2D(32, 4, strides=2, activation=activation, kernel_initializer=init[1]),
        layers.MaxPooling2D(2, strides=1),
        layers.Flatten(),
        layers.Dense(32, activation=activation, kernel_initializer=init[2]),
        layers.Dense(num_classes, kernel_initializer=init[3]),
    ], name="sample_convnet")
