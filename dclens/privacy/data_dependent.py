"""The data-dependent RDP analysis of the DataLens authors (paper Fig. 2) -- never spent.

The authors' ``--signsgd_dept`` mode computes, for every TopAgg call, a *data-dependent*
RDP bound beside the data-independent one and plots both epsilon curves (paper Fig. 2):

1. log q: the GNMax union bound of Papernot et al. (ICLR 2018, Prop. 7) applied to the
   call's *noisy* vote vector v (D coordinates): with i* = argmax_j v_j,
   q = sum_{j != i*} Pr[N(0, 2 s^2) >= v_i* - v_j], capped at 1 - 1/D (:func:`log_q`);
2. the data-dependent RDP of a Gaussian mechanism with noise s given q (Papernot et al.
   2018, Thm. 6, orders mu_2 = sqrt(s^2 log(1/q)), mu_1 = mu_2 + 1 as in their Prop. 10):
   for orders lambda < mu_1, when the theorem's conditions on q hold,

       RDP(lambda) = log((1 - q) A^(lambda-1) + q B^(lambda-1)) / (lambda - 1),
       A = (1 - q) / (1 - (q e^(eps_2))^((mu_2 - 1) / mu_2)),  B = e^(eps_1) / q^(1/(mu_1 - 1)),

   with eps_i = mu_i / s^2; elsewhere the data-independent lambda / s^2
   (:func:`data_dependent_rdp`).  Like the authors' ``double_rdp_gaussian``, the
   data-dependent value is taken where the theorem applies *without* comparing it with
   the data-independent one (that is what their Fig. 2 plots).

s is TopAgg's noise in GNMax units: GNMax has sensitivity sqrt(2), TopAgg 2 sqrt(k), so
s = sigma / sqrt(2k), and lambda / s^2 = 2 k lambda / sigma^2 is exactly the
data-independent RDP dclens spends.

**Why it is never spent.**  The bound is computed from the noisy output (so the bound
itself is data-dependent and unreleased in the authors' analysis), and GNMax's argmax
analysis does not describe TopAgg's release of a whole thresholded vector.  dclens spends
the data-independent bound only; this module is an analysis to draw Fig. 2, recorded
beside the ledger under a name that says so (``epsilon_data_dependent_analysis``).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import scipy.special
import scipy.stats


def log_q(noisy_votes: np.ndarray, sigma: float) -> float:
    """ln of the union bound on Pr[the noisy argmax moves] for one vote vector [D]."""
    votes = np.asarray(noisy_votes, np.float64).reshape(-1)
    if votes.size < 2:
        raise ValueError(f"need at least 2 coordinates, got {votes.size}")
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    top = int(np.argmax(votes))
    gaps = votes[top] - np.delete(votes, top)
    terms = scipy.stats.norm.logsf(gaps, scale=math.sqrt(2.0) * sigma)
    return float(min(scipy.special.logsumexp(terms), math.log(1.0 - 1.0 / votes.size)))


def _log1mexp(x: float) -> float:
    """log(1 - e^x) for x <= 0, stably."""
    if x > 0:
        raise ValueError(f"log1mexp needs x <= 0, got {x!r}")
    if x == 0:
        return -math.inf
    return math.log1p(-math.exp(x)) if x < -math.log(2.0) else math.log(-math.expm1(x))


def data_dependent_rdp(logq: float, sigma: float, orders: Sequence[float]) -> np.ndarray:
    """RDP at ``orders`` of a Gaussian mechanism with noise ``sigma`` given ln q (module
    docstring): the data-dependent value where Thm. 6 applies, else lambda / sigma^2."""
    orders = np.asarray(orders, np.float64)
    if logq > 0 or not sigma > 0 or np.any(orders <= 1):
        raise ValueError(f"need logq <= 0, sigma > 0 and orders > 1; got logq={logq!r}, "
                         f"sigma={sigma!r}")
    variance = sigma ** 2
    independent = orders / variance
    if math.isinf(logq):                       # a fixed output: no privacy loss
        return np.zeros_like(orders)
    mu2 = math.sqrt(variance * -logq)
    mu1 = mu2 + 1.0
    applies = (mu1 > orders) & (mu2 > 1.0)
    eps1, eps2 = mu1 / variance, mu2 / variance
    q_small_enough = logq <= (mu2 - 1.0) * eps2 - mu2 * (
        math.log1p(1.0 / (mu1 - 1.0)) + math.log1p(1.0 / (mu2 - 1.0))) if mu2 > 1 else False
    if not (applies.any() and q_small_enough and -logq > eps2):
        return independent
    log1q = _log1mexp(logq)
    log_a = (orders - 1.0) * (log1q - _log1mexp((logq + eps2) * (1.0 - 1.0 / mu2)))
    log_b = (orders - 1.0) * (eps1 - logq / (mu1 - 1.0))
    dependent = np.logaddexp(log1q + log_a, logq + log_b) / (orders - 1.0)
    return np.where(applies, dependent, independent)


def classic_epsilon(rdp: np.ndarray, orders: Sequence[float], delta: float) -> float:
    """min over orders of rdp + log(1/delta) / (order - 1): the authors' conversion."""
    orders = np.asarray(orders, np.float64)
    if not np.any(rdp):
        return 0.0
    return float(np.min(np.asarray(rdp) - math.log(delta) / (orders - 1.0)))


def topagg_call_rdp(noisy_votes: np.ndarray, *, sigma: float, topk: int,
                    orders: Sequence[float]) -> np.ndarray:
    """The authors' data-dependent RDP of one TopAgg call from its noisy votes [D]."""
    gnmax_sigma = sigma / math.sqrt(2.0 * topk)
    return data_dependent_rdp(log_q(noisy_votes, sigma), gnmax_sigma, orders)
