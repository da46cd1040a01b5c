"""Exact (epsilon, delta) of Gaussian compositions: privacy loss distributions (PLD).

Composed Gaussian mechanisms are one Gaussian mechanism
-------------------------------------------------------
A Gaussian mechanism with noise multiplier z (noise standard deviation z times the L2
sensitivity) is, for the worst pair of neighbouring datasets, the test between
N(0, 1) and N(mu, 1) with mu = 1/z: it is mu-GDP (Dong, Roth & Su 2019, Gaussian
differential privacy), and that is tight.  Adaptively composing mechanisms that are
mu_i-GDP gives exactly sqrt(sum_i mu_i^2)-GDP (their Corollary 3.3).  So ``count_i``
mechanisms with multipliers z_i, in any adaptive order, are exactly one Gaussian
mechanism with

    mu = sqrt(sum_i count_i / z_i^2).

Its (epsilon, delta) curve is known in closed form (Balle & Wang 2018, the analytic
Gaussian mechanism, Theorem 8): the mechanism is (epsilon, delta)-DP iff

    delta >= Phi(mu/2 - epsilon/mu) - e^epsilon Phi(-mu/2 - epsilon/mu),

and the right side decreases in epsilon, so the smallest epsilon at a given delta is a
root found by bisection.  No RDP order and no conversion loss enter: this is the exact
guarantee of the released composition (dp_accounting's PLD accountant computes the same
curve by discretising the privacy loss; tests check the two agree).

Subsampled Gaussians have no such closed form; for Poisson sampling under add-or-remove
adjacency :func:`pld_epsilon` composes the event with ``dp_accounting``'s
``PLDAccountant``, whose discretisation is pessimistic (it rounds the privacy loss up), so
its epsilon is an upper bound, tighter than any RDP conversion.

Units: epsilon and delta are for the unit of privacy of the mechanism whose noise
multipliers are passed (one training record for DataLens' TopAgg, whose multiplier
already carries the replace-one sensitivity 2 sqrt(k)).
This module does not import TensorFlow and keeps no state.
"""

from __future__ import annotations

import math
from typing import Iterable

import dp_accounting
from scipy import optimize, special

__all__ = ["composed_mu", "gaussian_delta", "gaussian_epsilon", "pld_epsilon",
           "PLD_DISCRETIZATION"]

#: dp_accounting's default privacy-loss discretisation interval, used by :func:`pld_epsilon`.
PLD_DISCRETIZATION = 1e-4


def composed_mu(runs: Iterable[tuple[float, int]]) -> float:
    """mu of the Gaussian mechanism equal to ``count`` mechanisms of multiplier ``z`` for
    every ``(z, count)`` in ``runs``: sqrt(sum count / z^2) (module docstring)."""
    total = 0.0
    for z, count in runs:
        if not (isinstance(z, (int, float)) and math.isfinite(z) and z > 0):
            raise ValueError(f"a Gaussian noise multiplier must be finite and > 0, got {z!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"a count of mechanisms must be an integer >= 0, got {count!r}")
        total += count / (z * z)
    return math.sqrt(total)


def gaussian_delta(mu: float, epsilon: float) -> float:
    """The smallest delta with which mu-GDP is (epsilon, delta)-DP:
    Phi(mu/2 - epsilon/mu) - e^epsilon Phi(-mu/2 - epsilon/mu), computed in log space
    (both terms underflow separately long before their difference matters)."""
    if mu < 0 or not math.isfinite(mu):
        raise ValueError(f"mu must be a finite number >= 0, got {mu!r}")
    if mu == 0:
        return 0.0
    log_first = float(special.log_ndtr(mu / 2 - epsilon / mu))
    log_second = epsilon + float(special.log_ndtr(-mu / 2 - epsilon / mu))
    if log_second >= log_first:       # Only by round-off: the difference is >= 0.
        return 0.0
    return math.exp(log_first) * -math.expm1(log_second - log_first)


def gaussian_epsilon(mu: float, delta: float, *, xtol: float = 1e-12) -> float:
    """The smallest epsilon >= 0 with which mu-GDP is (epsilon, delta)-DP (exact, up to
    ``xtol`` absolute, rounded up).  0 when even epsilon = 0 needs no more than ``delta``
    (including mu = 0: nothing released)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if gaussian_delta(mu, 0.0) <= delta:
        return 0.0
    high = max(1.0, mu * mu)
    while gaussian_delta(mu, high) > delta:
        high *= 2.0
        if high > 1e12:
            raise ValueError(f"no epsilon below 1e12 reaches delta={delta!r} at mu={mu!r}")
    root = optimize.brentq(lambda eps: gaussian_delta(mu, eps) - delta, 0.0, high,
                           xtol=xtol, maxiter=500)
    # brentq's root is within xtol (+ a few ulps) of the true one on either side: step
    # to the safe side, by at least one ulp so that a large epsilon still moves.
    epsilon = float(root)
    for _ in range(100):
        if gaussian_delta(mu, epsilon) <= delta:
            return epsilon
        epsilon = max(epsilon + xtol, math.nextafter(epsilon, math.inf))
    raise RuntimeError(f"could not bracket epsilon at mu={mu!r}, delta={delta!r}")


def pld_epsilon(event: dp_accounting.DpEvent, *, delta: float,
                relation: dp_accounting.NeighboringRelation,
                discretization: float = PLD_DISCRETIZATION) -> float:
    """Epsilon at ``delta`` of ``event`` by ``dp_accounting.pld.PLDAccountant`` under
    ``relation`` (pessimistic discretisation: an upper bound).

    Raises:
      ValueError: if the PLD accountant cannot compose ``event`` under ``relation``.
    """
    accountant = dp_accounting.pld.PLDAccountant(
        neighboring_relation=relation, value_discretization_interval=discretization)
    if not accountant.supports(event):
        raise ValueError(f"dp_accounting's PLD accountant cannot compose {event!r} under "
                         f"{relation.name}; use an RDP conversion for it")
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))
