"""The one private release of DP-MERF: the class-conditional embedding sum plus Gaussian noise.

For records (x_i, y_i), i = 1..n, with unit-norm features phi (:mod:`dclens.datalens.merf.features`)
and one-hot labels e_y in R^C, the released matrix is

    M~ = S + N(0, (Delta z)^2 I),   S = sum_i phi(x_i) e_{y_i}^T   in R^{D x C},

with Delta = :data:`SENSITIVITY` = 2 and noise multiplier z.  Replacing one record (x, y)
by (x', y') changes S by phi(x) e_y^T - phi(x') e_{y'}^T, of Frobenius norm at most
||phi(x)|| + ||phi(x')|| <= 2 (sqrt(2) when the labels differ), so M~ is the Gaussian
mechanism with L2 sensitivity 2 under replace-one adjacency: one ``GaussianDpEvent(z)``,
the same unit of privacy as DataLens' TopAgg queries (one training record), so the two
compose in one :class:`dclens.privacy.accounting.PrivacyLedger`.  The mean embedding a
generator is fitted to is M~ / n, with n the number of records (public: the run's record
count); dividing is post-processing.
"""

from __future__ import annotations

import dp_accounting
import numpy as np

from dclens.datalens.merf.features import FourierFeatures
from dclens.privacy import accounting

#: The replace-one L2 sensitivity of the embedding sum (module docstring).
SENSITIVITY = 2.0


def embedding_sum(features: FourierFeatures, images: np.ndarray, labels: np.ndarray,
                  num_classes: int, *, chunk: int = 2048) -> np.ndarray:
    """S = sum_i phi(x_i) e_{y_i}^T, float64 [D, C] (no noise: PRIVATE)."""
    labels = np.asarray(labels)
    if len(labels) != len(images):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got "
                         f"{labels.min()}..{labels.max()}")
    total = np.zeros((features.dim, num_classes), np.float64)
    for start in range(0, len(labels), chunk):
        phi = features.numpy(images[start:start + chunk])
        one_hot = np.eye(num_classes)[labels[start:start + chunk]]
        total += phi.T @ one_hot
    return total


def release(total: np.ndarray, noise_multiplier: float, rng: np.random.Generator
            ) -> np.ndarray:
    """S + N(0, (2 z)^2) in every entry: the released sum (DP, publishable)."""
    z = accounting.check_noise_multiplier(noise_multiplier)
    return total + rng.normal(0.0, SENSITIVITY * z, size=total.shape)


def event(noise_multiplier: float) -> dp_accounting.DpEvent:
    """The release's ``DpEvent``: one Gaussian mechanism with noise multiplier z."""
    return dp_accounting.GaussianDpEvent(accounting.check_noise_multiplier(noise_multiplier))
