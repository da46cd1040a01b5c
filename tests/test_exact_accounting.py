"""Exact accounting (``conversion="pld"``): the closed form of composed Gaussian mechanisms
against a numerical integral and dp_accounting's PLD accountant, its use by the ledgers
and the step budget, and the samplers it refuses."""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys

import dp_accounting
import numpy as np
import pytest
from scipy import integrate, stats

from dclens.gswgan.config import GswganConfig, GswganConfigError
from dclens.privacy import accounting, exact, sampled_ledger
from dclens.privacy.accounting import Conversion
from dclens.privacy.sampled_ledger import Sampling

REPO = pathlib.Path(__file__).resolve().parents[1]
ADD_OR_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


def hockey_stick(mu: float, epsilon: float) -> float:
    """delta(epsilon) of N(mu, 1) against N(0, 1) by quadrature: the integral of
    max(0, p(x) - e^eps q(x)), the definition, with no closed form used."""
    def integrand(x):
        return max(0.0, stats.norm.pdf(x, loc=mu) - math.exp(epsilon) * stats.norm.pdf(x))
    # p > e^eps q exactly for x > eps / mu + mu / 2; integrate over that half-line.
    start = epsilon / mu + mu / 2
    value, error = integrate.quad(integrand, start, np.inf, epsabs=1e-14, epsrel=1e-10)
    assert error < 1e-9
    return value


@pytest.mark.parametrize("mu,epsilon", [(0.3, 0.0), (0.5, 0.2), (1.0, 1.0), (2.0, 3.0),
                                        (4.0, 10.0), (0.05, 0.01)])
def test_closed_form_delta_matches_the_definition(mu, epsilon):
    assert exact.gaussian_delta(mu, epsilon) == pytest.approx(hockey_stick(mu, epsilon),
                                                              rel=1e-7, abs=1e-15)


@pytest.mark.parametrize("mu", [0.01, 0.2, 1.0, 3.0, 8.0, 40.0, 300.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-3])
def test_epsilon_is_the_smallest_that_holds(mu, delta):
    epsilon = exact.gaussian_epsilon(mu, delta)
    assert exact.gaussian_delta(mu, epsilon) <= delta
    if epsilon > 0:    # Tight: a little less epsilon needs more delta.
        assert exact.gaussian_delta(mu, epsilon - 1e-9) > delta
    else:
        assert exact.gaussian_delta(mu, 0.0) <= delta


def test_nothing_released_is_epsilon_zero():
    assert exact.gaussian_epsilon(0.0, 1e-5) == 0.0
    assert exact.composed_mu([]) == 0.0


def test_composition_is_one_gaussian():
    """mu = sqrt(sum count / z^2), against dp_accounting composing the runs one by one."""
    runs = [(3.0, 7), (0.9, 2), (12.0, 40)]
    mu = exact.composed_mu(runs)
    assert mu == pytest.approx(math.sqrt(7 / 9 + 2 / 0.81 + 40 / 144), rel=1e-15)
    accountant = dp_accounting.pld.PLDAccountant(ADD_OR_REMOVE)
    for z, count in runs:
        accountant.compose(dp_accounting.GaussianDpEvent(z), count)
    # Its discretisation (1e-4) rounds the loss up: equal to about that, never below.
    reference = accountant.get_epsilon(1e-5)
    assert exact.gaussian_epsilon(mu, 1e-5) <= reference + 1e-9
    assert exact.gaussian_epsilon(mu, 1e-5) == pytest.approx(reference, abs=2e-3)


@pytest.mark.parametrize("sigma,topk,queries", [(5000.0, 200, 30 * 43), (1500.0, 300, 50 * 86),
                                                (300.0, 50, 15 * 20), (800.0, 10, 64)])
def test_ledger_pld_is_the_exact_epsilon_and_beats_both_rdp_conversions(sigma, topk, queries):
    """The ledger's pld epsilon is dp_accounting's PLD accountant's (pessimistic, so it may
    only be above, by its discretisation) and below both RDP conversions (which bound it)."""
    ledgers = {c: accounting.PrivacyLedger(delta=1e-5, conversion=c) for c in Conversion}
    for ledger in ledgers.values():
        ledger.spend_topagg(sigma=sigma, topk=topk, queries=queries)
    eps = {c: ledger.epsilon().epsilon for c, ledger in ledgers.items()}
    pld = dp_accounting.pld.PLDAccountant(ADD_OR_REMOVE, value_discretization_interval=1e-5)
    pld.compose(accounting.topagg_event(sigma=sigma, topk=topk, queries=queries))
    reference = pld.get_epsilon(1e-5)
    assert eps[Conversion.PLD] <= reference + 1e-9
    assert eps[Conversion.PLD] == pytest.approx(reference, abs=5e-4)
    assert eps[Conversion.PLD] < eps[Conversion.DP_ACCOUNTING] < eps[Conversion.CLASSIC]
    report = ledgers[Conversion.PLD].epsilon()
    assert report.order is None and "pld accounting" in str(report)


def test_pld_ledger_round_trips_and_keeps_its_rdp_curve():
    ledger = accounting.PrivacyLedger(delta=1e-5, conversion="pld")
    ledger.spend_topagg(sigma=5000, topk=200, queries=1290)
    restored = accounting.PrivacyLedger.from_state_dict(
        json.loads(json.dumps(ledger.state_dict())))
    assert restored.epsilon() == ledger.epsilon()
    rdp = accounting.PrivacyLedger(delta=1e-5)
    rdp.spend_topagg(sigma=5000, topk=200, queries=1290)
    np.testing.assert_array_equal(ledger.rdp(), rdp.rdp())


@pytest.mark.parametrize("max_eps", [1.0, 10.0])
def test_step_budget_under_pld(max_eps):
    """The budget's stop: the steps found fit, one more does not, and the exact
    accounting fits at least as many steps as either RDP conversion."""
    common = dict(sigma=5000.0, topk=200, queries_per_step=50, delta=1e-5)
    steps = {c: accounting.max_steps_within(max_eps=max_eps, conversion=c, **common)
             for c in Conversion}
    exact_steps = steps[Conversion.PLD]
    assert accounting.epsilon_for(steps=exact_steps, conversion="pld",
                                  **common).epsilon <= max_eps
    assert accounting.epsilon_for(steps=exact_steps + 1, conversion="pld",
                                  **common).epsilon > max_eps
    assert exact_steps > steps[Conversion.DP_ACCOUNTING] >= steps[Conversion.CLASSIC]


def test_calibrated_sigma_under_pld_meets_the_target_tightly():
    sigma = accounting.calibrate_sigma(target_epsilon=1.0, topk=200, queries_per_step=50,
                                       steps=86, delta=1e-5, conversion="pld", tol=1e-6)
    common = dict(topk=200, queries_per_step=50, steps=86, delta=1e-5, conversion="pld")
    assert accounting.epsilon_for(sigma=sigma, **common).epsilon <= 1.0
    assert accounting.epsilon_for(sigma=sigma * (1 - 1e-5), **common).epsilon > 1.0


# --------------------------------------------------------------------------------------
# The sampled ledger (DP-SGD, GEP) and the sampler it refuses (GS-WGAN).
# --------------------------------------------------------------------------------------

def _poisson(rate, z, steps):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(z)), steps)


def test_poisson_ledger_pld_is_below_rdp_and_exact_at_rate_one():
    pld = sampled_ledger.SampledGaussianLedger(delta=1e-5, conversion="pld")
    rdp = sampled_ledger.SampledGaussianLedger(delta=1e-5)
    for ledger in (pld, rdp):
        ledger.spend(_poisson(256 / 60000, 1.1, 3000))
    assert 0 < pld.epsilon().epsilon < rdp.epsilon().epsilon
    # Sampling every example is no sampling: the closed form of the composed Gaussians.
    full = sampled_ledger.SampledGaussianLedger(delta=1e-5, conversion="pld")
    full.spend(_poisson(1.0, 4.0, 9))
    closed = exact.gaussian_epsilon(exact.composed_mu([(4.0, 9)]), 1e-5)
    assert full.epsilon().epsilon == pytest.approx(closed, abs=5e-4)
    assert full.epsilon().epsilon >= closed - 1e-9     # pessimistic, never below


def test_pld_calibration_needs_less_noise():
    common = dict(target_epsilon=1.0, rate=256 / 60000, steps=2000, delta=1e-5)
    assert (sampled_ledger.calibrate_noise_multiplier(conversion="pld", **common)
            < sampled_ledger.calibrate_noise_multiplier(conversion="dp_accounting", **common))


def test_without_replacement_refuses_pld_with_the_reason():
    with pytest.raises(ValueError, match="'pld' is not available for without_replacement"):
        sampled_ledger.SampledGaussianLedger(delta=1e-5, conversion="pld",
                                             sampling=Sampling.WITHOUT_REPLACEMENT)
    with pytest.raises(GswganConfigError, match="conversion = .*pld.*dp_accounting"):
        GswganConfig(conversion="pld")


def test_privacy_cli_reports_pld_steps():
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "privacy.py"), "--sigma", "5000", "--topk",
         "200", "--queries_per_step", "50", "--max_eps", "1", "--json"],
        capture_output=True, text=True, timeout=120, cwd=REPO.parent)
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout)["results"]
    assert set(results) == {"classic", "dp_accounting", "pld"}
    assert results["pld"]["order"] is None
    assert results["pld"]["max_steps"] == accounting.max_steps_within(
        sigma=5000, topk=200, queries_per_step=50, max_eps=1, delta=1e-5, conversion="pld")
    assert results["pld"]["max_steps"] > results["dp_accounting"]["max_steps"]
