"""The authors' data-dependent RDP analysis (dclens/privacy/data_dependent.py): against the
formulas computed by hand on small vote vectors, and never spent by a run."""

import math

import numpy as np
import pytest
from conftest import load_script, synthetic_fashion_mnist

from dclens.privacy import data_dependent
from dclens.datalens.config import (Aggregation, BudgetConfig, ConfigError, DataLensConfig,
                           TopAggConfig, TrainConfig)
from dclens.datalens.train import DataLens


def _tail(gap: float, sigma: float) -> float:
    """Pr[N(0, 2 sigma^2) >= gap] = erfc(gap / (2 sigma)) / 2."""
    return 0.5 * math.erfc(gap / (2.0 * sigma))


def test_log_q_is_the_union_bound_over_the_non_argmax_coordinates():
    votes = np.array([4.0, 10.0, 1.0, -3.0])
    want = math.log(_tail(6.0, 2.0) + _tail(9.0, 2.0) + _tail(13.0, 2.0))
    assert data_dependent.log_q(votes, 2.0) == pytest.approx(want, rel=1e-12)


def test_log_q_is_capped_at_one_minus_one_over_n():
    # Four equal votes: the union bound is 3 x 1/2 > 1; the cap is 1 - 1/4.
    assert data_dependent.log_q(np.zeros(4), 1.0) == pytest.approx(math.log(0.75))
    with pytest.raises(ValueError, match="at least 2"):
        data_dependent.log_q(np.zeros(1), 1.0)


def _by_hand(logq, sigma, order):
    """Papernot et al. 2018 Thm. 6 in plain (not log-space) arithmetic."""
    q = math.exp(logq)
    mu2 = math.sqrt(sigma ** 2 * -logq)
    mu1 = mu2 + 1
    eps1, eps2 = mu1 / sigma ** 2, mu2 / sigma ** 2
    a = (1 - q) / (1 - (q * math.exp(eps2)) ** ((mu2 - 1) / mu2))
    b = math.exp(eps1) / q ** (1 / (mu1 - 1))
    return math.log((1 - q) * a ** (order - 1) + q * b ** (order - 1)) / (order - 1)


def test_data_dependent_rdp_follows_the_theorem_where_it_applies():
    logq, sigma = -20.0, 2.0                 # mu_2 = sqrt(80) ~ 8.94, mu_1 ~ 9.94
    orders = [2.0, 3.0, 5.0, 9.0, 12.0, 40.0]
    got = data_dependent.data_dependent_rdp(logq, sigma, orders)
    for order, value in zip(orders, got):
        if order < math.sqrt(80) + 1:
            assert value == pytest.approx(_by_hand(logq, sigma, order), rel=1e-9)
            assert value < order / sigma ** 2        # tighter here than data-independent
        else:
            assert value == order / sigma ** 2


def test_without_a_clear_winner_it_is_the_data_independent_bound():
    orders = [1.1, 2.0, 10.0]
    got = data_dependent.data_dependent_rdp(math.log(0.5), 3.0, orders)
    np.testing.assert_allclose(got, np.array(orders) / 9.0)
    assert np.all(data_dependent.data_dependent_rdp(-math.inf, 3.0, orders) == 0)


def test_topagg_call_uses_the_gnmax_scaled_noise():
    votes = np.zeros(50)
    votes[7] = 400.0
    orders = [2.0, 3.0]
    sigma, topk = 30.0, 8
    logq = data_dependent.log_q(votes, sigma)
    np.testing.assert_allclose(
        data_dependent.topagg_call_rdp(votes, sigma=sigma, topk=topk, orders=orders),
        data_dependent.data_dependent_rdp(logq, sigma / math.sqrt(2 * topk), orders))


def _lens(analysis: bool) -> DataLens:
    dataset = synthetic_fashion_mnist(40)
    config = DataLensConfig(
        train=TrainConfig(num_teachers=4, batch_size=5, d_step=1, pretrain_teacher=0,
                          z_dim=6, teacher_chunk=4, data_dependent_analysis=analysis),
        topagg=TopAggConfig(topk=20, sigma=3.0, thresh=0.3),
        budget=BudgetConfig(max_eps=1e6))
    return DataLens(config, dataset, root_seed=1)


def test_the_analysis_is_recorded_and_never_spent(monkeypatch):
    """Each call's analysis RDP is accumulated into the record's epsilon; the ledger (and
    the run's epsilon) is the same as without the analysis."""
    calls = []

    def fixed_rdp(votes, *, sigma, topk, orders):
        calls.append(votes.shape)
        return np.full(len(orders), 1e-3)

    monkeypatch.setattr(data_dependent, "topagg_call_rdp", fixed_rdp)
    plain, analysed = _lens(False), _lens(True)
    for step in range(2):
        a, b = plain.train_step(), analysed.train_step()
        assert a.epsilon == b.epsilon                        # the ledger is untouched
        assert a.epsilon_data_dependent_analysis is None
        queries = 5 * (step + 1)
        want = min(queries * 1e-3 + math.log(1e5) / (o - 1)
                   for o in analysed.analysis_orders)
        assert b.epsilon_data_dependent_analysis == pytest.approx(want, rel=1e-12)
    assert calls == [(784,)] * 10                           # one per query (image)
    assert plain.ledger.state_dict() == analysed.ledger.state_dict()
    assert "analysis_data_dependent_rdp" in analysed.state_arrays()
    assert "analysis_data_dependent_rdp" not in plain.state_arrays()


def test_the_analysis_is_refused_where_it_is_not_defined():
    with pytest.raises(ConfigError, match="top-k sign aggregations only"):
        DataLensConfig(train=TrainConfig(data_dependent_analysis=True),
                       topagg=TopAggConfig(method=Aggregation.KLEVEL))


def test_plot_privacy_draws_both_curves(tmp_path, capsys):
    import json
    cli = load_script("plot_privacy")
    (tmp_path / "privacy.json").write_text(json.dumps({
        "delta": 1e-5, "conversion": "classic", "epsilon_per_step": [
            {"step": 1, "epsilon": 0.2, "epsilon_data_dependent_analysis": 0.3},
            {"step": 2, "epsilon": 0.3, "epsilon_data_dependent_analysis": 0.5}]}))
    assert cli.main([str(tmp_path)]) == 0
    assert (tmp_path / "epsilon.png").stat().st_size > 0
    assert "0.5000 (data-dependent analysis, not spent)" in capsys.readouterr().out
    (tmp_path / "privacy.json").write_text(json.dumps({"epsilon_per_step": []}))
    assert cli.main([str(tmp_path)]) == 2
