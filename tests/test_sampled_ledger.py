"""The ledger of subsampled Gaussian steps (dclens/privacy/sampled_ledger.py): RDP against the
closed form for integer orders, the joint noise multiplier, state, journal, calibration."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest

from dclens.runs import journal
from dclens.privacy import sampled_ledger
from dclens.privacy.sampled_ledger import SampledGaussianLedger

ORDERS = [2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 16.0, 32.0]


def _poisson(q, z, steps=1, releases=1):
    inner = dp_accounting.GaussianDpEvent(z)
    if releases > 1:
        inner = dp_accounting.ComposedDpEvent([inner] * releases)
    step = dp_accounting.PoissonSampledDpEvent(q, inner)
    return step if steps == 1 else dp_accounting.SelfComposedDpEvent(step, steps)


def _poisson_rdp_by_hand(q: float, z: float, alpha: int) -> float:
    """Mironov, Talwar, Zhang 2019 (Sampled Gaussian Mechanism), integer alpha:
    RDP = log(sum_k C(alpha, k) (1-q)^(alpha-k) q^k exp((k^2 - k) / (2 z^2))) / (alpha - 1)."""
    total = math.fsum(math.comb(alpha, k) * (1 - q) ** (alpha - k) * q ** k
                      * math.exp((k * k - k) / (2 * z * z)) for k in range(alpha + 1))
    return math.log(total) / (alpha - 1)


def test_poisson_rdp_and_classic_epsilon_equal_the_closed_form():
    q, z, steps, delta = 0.02, 1.1, 500, 1e-5
    ledger = SampledGaussianLedger(delta=delta, conversion="classic", orders=ORDERS)
    ledger.spend(_poisson(q, z, steps))
    by_hand = [steps * _poisson_rdp_by_hand(q, z, int(a)) for a in ORDERS]
    eps_by_hand = min(r + math.log(1 / delta) / (a - 1) for r, a in zip(by_hand, ORDERS))
    assert ledger.epsilon().epsilon == pytest.approx(eps_by_hand, rel=1e-9)
    assert ledger.queries == steps


def test_no_subsampling_is_the_plain_gaussian():
    ledger = SampledGaussianLedger(delta=1e-5, conversion="classic", orders=ORDERS)
    ledger.spend(_poisson(1.0, 2.0, 10))
    expected = min(10 * a / (2 * 4.0) + math.log(1e5) / (a - 1) for a in ORDERS)
    assert ledger.epsilon().epsilon == pytest.approx(expected, rel=1e-12)


def test_two_releases_on_one_sample_are_one_gaussian_with_z_over_sqrt2():
    assert sampled_ledger.joint_noise_multiplier(
        dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(3.0)] * 2)) == \
        pytest.approx(3.0 / math.sqrt(2), rel=1e-15)
    assert sampled_ledger.joint_noise_multiplier(dp_accounting.ComposedDpEvent([
        dp_accounting.GaussianDpEvent(1.0), dp_accounting.GaussianDpEvent(2.0)])) == \
        pytest.approx((1 + 1 / 4) ** -0.5, rel=1e-15)
    # The same number dp_accounting gives for the composed event inside the sampling.
    ledger = SampledGaussianLedger(delta=1e-5)
    ledger.spend(_poisson(0.01, 1.5, 300, releases=2))
    direct = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    direct.compose(_poisson(0.01, 1.5, 300, releases=2))
    assert ledger.epsilon().epsilon == pytest.approx(direct.get_epsilon(1e-5), rel=1e-9)
    # ... and it costs more than one release (the composition is not dropped).
    single = SampledGaussianLedger(delta=1e-5)
    single.spend(_poisson(0.01, 1.5, 300))
    assert ledger.epsilon().epsilon > single.epsilon().epsilon * 1.2


def test_without_replacement_uses_replace_one():
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
        1000, 1, dp_accounting.GaussianDpEvent(0.8)), 2000)
    ledger = SampledGaussianLedger(delta=1e-5, sampling="without_replacement")
    ledger.spend(event)
    direct = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    direct.compose(event)
    assert ledger.epsilon().epsilon == pytest.approx(direct.get_epsilon(1e-5), rel=1e-9)
    with pytest.raises(ValueError, match="use a ledger per sampler"):
        ledger.spend(_poisson(0.1, 1.0))


def test_spending_in_pieces_equals_at_once_and_after_event_does_not_spend():
    whole, pieces = SampledGaussianLedger(delta=1e-5), SampledGaussianLedger(delta=1e-5)
    whole.spend(_poisson(0.05, 1.0, 40))
    for _ in range(40):
        before = pieces.epsilon().epsilon
        after = pieces.epsilon_after_event(_poisson(0.05, 1.0))
        assert pieces.epsilon().epsilon == before
        pieces.spend(_poisson(0.05, 1.0))
        assert pieces.epsilon().epsilon == after.epsilon
    assert pieces.epsilon().epsilon == whole.epsilon().epsilon
    assert pieces.state_dict()["spends"] == [{"rate": 0.05, "noise_multiplier": 1.0,
                                              "count": 40}]


def test_state_round_trip_and_tampering_refused():
    ledger = SampledGaussianLedger(delta=1e-5, conversion="classic")
    ledger.spend(_poisson(0.02, 1.2, 7))
    ledger.spend(_poisson(0.02, 0.9, 3))
    state = ledger.state_dict()
    again = sampled_ledger.ledger_from_state_dict(state)
    assert isinstance(again, SampledGaussianLedger)
    assert again.epsilon() == ledger.epsilon() and again.queries == 10
    for bad, match in (({**state, "spends": [{"rate": 1.5, "noise_multiplier": 1.0,
                                              "count": 1}]}, "rate"),
                       ({**state, "spends": [{"rate": 0.1, "noise_multiplier": -1.0,
                                              "count": 1}]}, "noise"),
                       ({**state, "extra": 1}, "exactly the keys"),
                       ({**state, "version": 2}, "state version must be 1, got 2"),
                       ({**state, "kind": "topagg"}, "kind must be 'sampled_gaussian'")):
        with pytest.raises((ValueError, TypeError), match=match):
            SampledGaussianLedger.from_state_dict(bad)
    with pytest.raises(TypeError, match="Poisson-sampled"):
        ledger.spend(dp_accounting.GaussianDpEvent(1.0))    # an unsampled step: say so


def test_journal_keeps_a_sampled_ledger(tmp_path):
    ledger = SampledGaussianLedger(delta=1e-5)
    record = journal.PrivacyJournal(tmp_path / "ledger.json", ledger)
    for step in range(3):
        ledger.spend(_poisson(0.01, 1.0))
        record.append(step, 0, 1)
    loaded = journal.PrivacyJournal.load(tmp_path / "ledger.json")
    assert isinstance(loaded.ledger, SampledGaussianLedger)
    assert loaded.ledger.epsilon() == ledger.epsilon() and loaded.queries == 3


@pytest.mark.parametrize("releases", [1, 2])
def test_calibration_is_the_smallest_sigma_within_the_target(releases):
    sigma = sampled_ledger.calibrate_noise_multiplier(
        target_epsilon=2.0, rate=0.01, steps=1000, delta=1e-5, releases=releases,
        tolerance=1e-4)

    def epsilon(s):
        ledger = SampledGaussianLedger(delta=1e-5)
        ledger.spend(_poisson(0.01, s, 1000, releases=releases))
        return ledger.epsilon().epsilon
    assert epsilon(sigma) <= 2.0 < epsilon(sigma * (1 - 3e-4))
    assert np.isfinite(sigma) and sigma > 0.3
