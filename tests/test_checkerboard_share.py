"""``quality.checkerboard_share``: the share of an image's spectral power in patterns that
alternate every pixel (the transposed convolutions' checkerboard), against a slow,
obviously correct reference (Parseval and the three alternating sums), and on exact
patterns."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dclens.evaluation import quality


def _slow_share(image: np.ndarray) -> float:
    """One H x W image: |sum x (-1)^(i+j)|^2 + |sum x (-1)^i|^2 + |sum x (-1)^j|^2 over the
    total power H W sum (x - mean)^2 (Parseval), loops over pixels."""
    h, w = image.shape
    mean = sum(image[i, j] for i in range(h) for j in range(w)) / (h * w)
    checker = rows = columns = energy = 0.0
    for i in range(h):
        for j in range(w):
            centred = image[i, j] - mean
            checker += centred * (-1) ** (i + j)
            rows += centred * (-1) ** i
            columns += centred * (-1) ** j
            energy += centred ** 2
    return 0.0 if energy == 0 else (checker ** 2 + rows ** 2 + columns ** 2) / (h * w * energy)


def test_it_matches_the_slow_reference_on_random_images():
    rng = np.random.default_rng(3)
    images = rng.uniform(size=(5, 8, 6))
    images[0] += 0.5 * (-1.0) ** np.add.outer(np.arange(8), np.arange(6))   # a checkerboard
    images[1] += 0.3 * (-1.0) ** np.arange(8)[:, None]                       # stripes
    expected = np.mean([_slow_share(image) for image in images])
    assert quality.checkerboard_share(images) == pytest.approx(expected, rel=1e-10)
    assert quality.checkerboard_share(images[..., None]) == pytest.approx(expected, rel=1e-10)


def test_exact_patterns():
    i, j = np.meshgrid(np.arange(28), np.arange(28), indexing="ij")
    checkerboard = (-1.0) ** (i + j)
    stripes = (-1.0) ** i
    assert quality.checkerboard_share(checkerboard[None]) == pytest.approx(1.0)
    assert quality.checkerboard_share(stripes[None]) == pytest.approx(1.0)
    assert quality.checkerboard_share(np.full((1, 28, 28), 0.7)) == 0.0
    blob = np.exp(-((i - 13.5) ** 2 + (j - 13.5) ** 2) / 50.0)
    assert quality.checkerboard_share(blob[None]) < 1e-6
    # half the power alternating: a checkerboard plus an orthogonal pattern of equal power
    half = checkerboard + np.cos(2 * np.pi * i / 28) * np.sqrt(2)
    assert quality.checkerboard_share(half[None]) == pytest.approx(0.5)
    assert quality.checkerboard_share(np.stack([checkerboard, blob])) == pytest.approx(
        (1.0 + quality.checkerboard_share(blob[None])) / 2)


@pytest.mark.parametrize("shape", [(2, 27, 28), (2, 28, 27, 1), (0, 28, 28), (28, 28, 1, 1, 1),
                                   (784,)])
def test_a_bad_shape_is_refused_by_value(shape):
    with pytest.raises(ValueError, match=re.escape(f"H, W even, got shape {shape}")):
        quality.checkerboard_share(np.zeros(shape))
