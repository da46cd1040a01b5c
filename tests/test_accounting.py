"""Tests for dclens.privacy.accounting and scripts/privacy.py (no TensorFlow needed)."""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys

import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant
import numpy as np
import pytest

from dclens.privacy import accounting
from dclens.privacy.accounting import Conversion, PrivacyLedger

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "privacy.py"

# The DataLens authors' F-MNIST eps=1 flags.
GOLDEN = dict(sigma=5000.0, topk=200, queries_per_step=30, delta=1e-5)
# (step, epsilon, optimal order) from the authors' code, classic conversion, --orders 200.
GOLDEN_STEPS = [(1, 0.14915694, 156.0), (2, 0.21122296, None), (10, 0.47495766, 50.0),
                (43, 0.99570523, 25.0)]


def _closed_form_rdp(*, sigma: float, topk: int, queries: int,
                     orders: tuple[float, ...]) -> np.ndarray:
    return queries * 2.0 * topk * np.asarray(orders) / sigma**2


# --------------------------------------------------------------------------------------
# Orders and the mechanism.
# --------------------------------------------------------------------------------------

def test_classic_orders_match_the_authors_flag():
    assert accounting.CLASSIC_ORDERS == (1.1,) + tuple(float(a) for a in range(2, 200))
    assert accounting.classic_orders(200) == accounting.CLASSIC_ORDERS
    assert accounting.classic_orders(3) == (1.1, 2.0)
    assert accounting.DP_ACCOUNTING_ORDERS == tuple(
        float(a) for a in rdp_privacy_accountant.DEFAULT_RDP_ORDERS)


def test_noise_multiplier_and_event():
    z = accounting.topagg_noise_multiplier(sigma=5000, topk=200)
    assert z == pytest.approx(5000 / (2 * math.sqrt(200)), rel=1e-15)
    assert accounting.topagg_event(sigma=5000, topk=200) == dp_accounting.GaussianDpEvent(z)
    assert accounting.topagg_event(sigma=5000, topk=200, queries=30) == (
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), 30))


@pytest.mark.parametrize("conversion", list(Conversion))
@pytest.mark.parametrize("sigma,topk,queries", [(5000.0, 200, 30), (800.0, 300, 1),
                                                (40.0, 1, 1234), (9000.0, 700, 64000)])
def test_rdp_equals_closed_form(conversion, sigma, topk, queries):
    ledger = PrivacyLedger(delta=1e-5, conversion=conversion)
    ledger.spend_topagg(sigma=sigma, topk=topk, queries=queries)
    expected = _closed_form_rdp(sigma=sigma, topk=topk, queries=queries,
                                orders=ledger.orders)
    np.testing.assert_allclose(ledger.rdp(), expected, rtol=1e-12, atol=0)
    # ... and equals what dp_accounting itself computes for the same event.
    direct = dp_accounting.rdp.RdpAccountant(orders=list(ledger.orders))
    direct.compose(accounting.topagg_event(sigma=sigma, topk=topk, queries=queries))
    np.testing.assert_array_equal(ledger.rdp(), direct.rdp)


# --------------------------------------------------------------------------------------
# Golden values (the DataLens authors' code) and dp_accounting's conversion.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("steps,epsilon,order", GOLDEN_STEPS)
def test_classic_golden_values(steps, epsilon, order):
    report = accounting.epsilon_for(steps=steps, conversion=Conversion.CLASSIC, **GOLDEN)
    assert report.epsilon == pytest.approx(epsilon, abs=1e-8)
    assert report.conversion is Conversion.CLASSIC
    assert report.delta == 1e-5
    if order is not None:
        assert report.order == order


def test_classic_golden_curve_and_budget():
    curve = accounting.epsilon_curve(steps=44, conversion="classic", **GOLDEN)
    assert len(curve) == 44
    for steps, epsilon, _ in GOLDEN_STEPS:
        assert curve[steps - 1].epsilon == pytest.approx(epsilon, abs=1e-8)
    assert curve[42].epsilon <= 1.0 < curve[43].epsilon
    assert curve[43].epsilon == pytest.approx(1.00744198, abs=1e-8)
    # The curve is exactly epsilon_for at every step.
    for steps in (1, 17, 44):
        assert curve[steps - 1] == accounting.epsilon_for(
            steps=steps, conversion="classic", **GOLDEN)
    assert accounting.max_steps_within(max_eps=1.0, conversion=Conversion.CLASSIC,
                                       **GOLDEN) == 43


def test_dp_accounting_conversion_value():
    report = accounting.epsilon_for(sigma=5000.0, topk=200, queries_per_step=1500, steps=1,
                                    delta=1e-5, conversion=Conversion.DP_ACCOUNTING)
    orders = np.asarray(rdp_privacy_accountant.DEFAULT_RDP_ORDERS, dtype=float)
    closed_eps, closed_order = dp_accounting.rdp.compute_epsilon(
        orders, _closed_form_rdp(sigma=5000.0, topk=200, queries=1500, orders=orders),
        1e-5)
    assert abs(report.epsilon - closed_eps) < 0.01
    assert report.epsilon == pytest.approx(closed_eps, rel=1e-12)
    assert report.order == closed_order == 20.0
    assert report.epsilon == pytest.approx(0.876980031, abs=1e-8)
    assert report.conversion is Conversion.DP_ACCOUNTING


@pytest.mark.parametrize("queries", [1, 30, 1290, 100000])
def test_dp_accounting_conversion_is_tighter_on_the_same_orders(queries):
    kwargs = dict(sigma=5000.0, topk=200, queries_per_step=queries, steps=1, delta=1e-5,
                  orders=accounting.CLASSIC_ORDERS)
    tight = accounting.epsilon_for(conversion="dp_accounting", **kwargs)
    classic = accounting.epsilon_for(conversion="classic", **kwargs)
    assert tight.epsilon < classic.epsilon


def test_nothing_spent_is_zero_epsilon():
    for conversion in Conversion:
        ledger = PrivacyLedger(delta=1e-5, conversion=conversion)
        assert ledger.queries == 0
        assert ledger.epsilon().epsilon == 0.0
        assert not np.any(ledger.rdp())


# --------------------------------------------------------------------------------------
# The ledger.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("conversion", list(Conversion))
def test_epsilon_after_does_not_spend(conversion):
    ledger = PrivacyLedger(delta=1e-5, conversion=conversion)
    ledger.spend_topagg(sigma=5000.0, topk=200, queries=30)
    before = ledger.epsilon()
    after = ledger.epsilon_after(sigma=5000.0, topk=200, queries=30)
    assert ledger.epsilon() == before
    assert ledger.queries == 30
    assert after.epsilon > before.epsilon
    ledger.spend_topagg(sigma=5000.0, topk=200, queries=30)
    assert ledger.epsilon() == after


@pytest.mark.parametrize("conversion", list(Conversion))
def test_spending_composes(conversion):
    split = PrivacyLedger(delta=1e-5, conversion=conversion)
    split.spend_topagg(sigma=5000.0, topk=200, queries=30)
    split.spend_topagg(sigma=5000.0, topk=200, queries=70)
    whole = PrivacyLedger(delta=1e-5, conversion=conversion)
    whole.spend_topagg(sigma=5000.0, topk=200, queries=100)
    assert split.queries == whole.queries == 100
    assert split.epsilon() == whole.epsilon()
    np.testing.assert_array_equal(split.rdp(), whole.rdp())
    # Generic events of the same mechanism compose the same way.
    generic = PrivacyLedger(delta=1e-5, conversion=conversion)
    generic.spend(accounting.topagg_event(sigma=5000.0, topk=200, queries=30))
    generic.spend(dp_accounting.ComposedDpEvent([
        accounting.topagg_event(sigma=5000.0, topk=200),
        accounting.topagg_event(sigma=5000.0, topk=200, queries=69)]))
    assert generic.queries == 100
    assert generic.epsilon() == whole.epsilon()


def test_mixed_noise_levels_compose_additively():
    ledger = PrivacyLedger(delta=1e-5, conversion="classic")
    ledger.spend_topagg(sigma=5000.0, topk=200, queries=30)
    ledger.spend_topagg(sigma=800.0, topk=300, queries=5)
    expected = (_closed_form_rdp(sigma=5000.0, topk=200, queries=30, orders=ledger.orders)
                + _closed_form_rdp(sigma=800.0, topk=300, queries=5, orders=ledger.orders))
    np.testing.assert_allclose(ledger.rdp(), expected, rtol=1e-12)
    assert ledger.queries == 35
    assert len(ledger.state_dict()["spends"]) == 2


@pytest.mark.parametrize("conversion", list(Conversion))
def test_state_dict_round_trip(conversion):
    ledger = PrivacyLedger(delta=1e-5, conversion=conversion)
    for _ in range(5):
        ledger.spend_topagg(sigma=5000.0, topk=200, queries=30)
    ledger.spend_topagg(sigma=1234.5, topk=7, queries=3)
    state = json.loads(json.dumps(ledger.state_dict()))
    restored = PrivacyLedger.from_state_dict(state)
    assert restored.epsilon() == ledger.epsilon()
    assert restored.queries == ledger.queries == 153
    assert restored.orders == ledger.orders
    assert restored.conversion is conversion
    assert restored.state_dict() == ledger.state_dict()
    # A constant-sigma run stays one entry long however many steps it takes.
    assert state["spends"][0] == {"noise_multiplier": ledger.state_dict()["spends"][0][
        "noise_multiplier"], "count": 150}
    # The restored ledger keeps composing identically.
    restored.spend_topagg(sigma=5000.0, topk=200, queries=30)
    ledger.spend_topagg(sigma=5000.0, topk=200, queries=30)
    assert restored.epsilon() == ledger.epsilon()


def _state() -> dict:
    ledger = PrivacyLedger(delta=1e-5, conversion="classic")
    ledger.spend_topagg(sigma=5000.0, topk=200, queries=30)
    return json.loads(json.dumps(ledger.state_dict()))


@pytest.mark.parametrize("tamper,error,quoted", [
    (lambda s: s["spends"][0].update(count=-30), ValueError, "-30"),
    (lambda s: s["spends"][0].update(count=0), ValueError, "got 0"),
    (lambda s: s["spends"][0].update(count=2.5), TypeError, "2.5"),
    (lambda s: s["spends"][0].update(noise_multiplier=0.0), ValueError, "0.0"),
    (lambda s: s["spends"][0].update(noise_multiplier=float("nan")), ValueError, "nan"),
    (lambda s: s["spends"][0].update(extra=1), ValueError, "extra"),
    (lambda s: s.update(conversion="moments"), ValueError, "'moments'"),
    (lambda s: s.update(delta=0.0), ValueError, "0.0"),
    (lambda s: s.update(delta=1.5), ValueError, "1.5"),
    (lambda s: s.update(orders=[0.5, 2.0]), ValueError, "0.5"),
    (lambda s: s.update(orders=[]), ValueError, "empty"),
    (lambda s: s.update(version=99), ValueError, "99"),
    (lambda s: s.pop("spends"), ValueError, "spends"),
    (lambda s: s.update(epsilon=0.0), ValueError, "epsilon"),
    (lambda s: s.update(spends={"noise_multiplier": 1.0}), TypeError, "noise_multiplier"),
])
def test_from_state_dict_rejects_invalid_state(tamper, error, quoted):
    state = _state()
    tamper(state)
    with pytest.raises(error, match=None) as info:
        PrivacyLedger.from_state_dict(state)
    assert quoted in str(info.value)


def test_from_state_dict_rejects_non_mapping():
    with pytest.raises(TypeError, match="mapping"):
        PrivacyLedger.from_state_dict([1, 2])


def test_spend_rejects_unsupported_events_without_recording():
    ledger = PrivacyLedger(delta=1e-5)
    for event in (dp_accounting.LaplaceDpEvent(1.0),
                  dp_accounting.PoissonSampledDpEvent(
                      0.1, dp_accounting.GaussianDpEvent(1.0)),
                  dp_accounting.NonPrivateDpEvent(), "gaussian"):
        with pytest.raises(TypeError, match="GaussianDpEvent") as info:
            ledger.spend(event)
        assert type(event).__name__ in str(info.value)
    # A composite with one bad part records nothing.
    with pytest.raises(TypeError, match="LaplaceDpEvent"):
        ledger.spend(dp_accounting.ComposedDpEvent([
            dp_accounting.GaussianDpEvent(1.0), dp_accounting.LaplaceDpEvent(1.0)]))
    with pytest.raises(ValueError, match="-3"):
        ledger.spend(dp_accounting.SelfComposedDpEvent(
            dp_accounting.GaussianDpEvent(1.0), -3))
    with pytest.raises(ValueError, match="0.0"):
        ledger.spend(dp_accounting.GaussianDpEvent(0.0))
    assert ledger.queries == 0


def test_dp_event_reproduces_the_epsilon_in_dp_accounting():
    ledger = PrivacyLedger(delta=1e-5)
    ledger.spend_topagg(sigma=5000.0, topk=200, queries=300)
    ledger.spend_topagg(sigma=3000.0, topk=100, queries=10)
    direct = dp_accounting.rdp.RdpAccountant()
    direct.compose(ledger.dp_event())
    assert direct.get_epsilon(1e-5) == ledger.epsilon().epsilon


def test_report_to_dict_is_json():
    report = accounting.epsilon_for(steps=43, conversion="classic", **GOLDEN)
    assert json.loads(json.dumps(report.to_dict())) == {
        "epsilon": report.epsilon, "order": 25.0, "delta": 1e-5, "conversion": "classic"}
    assert "classic" in str(report)


# --------------------------------------------------------------------------------------
# Monotonicity, budget and calibration.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("conversion", list(Conversion))
def test_monotonicity(conversion):
    by_queries = [accounting.epsilon_for(sigma=5000.0, topk=200, queries_per_step=q,
                                         steps=1, delta=1e-5,
                                         conversion=conversion).epsilon
                  for q in (1, 10, 100, 1000, 10000)]
    assert all(a < b for a, b in zip(by_queries, by_queries[1:]))
    by_sigma = [accounting.epsilon_for(sigma=s, topk=200, queries_per_step=30, steps=43,
                                       delta=1e-5, conversion=conversion).epsilon
                for s in (500.0, 1000.0, 2000.0, 5000.0, 10000.0)]
    assert all(a > b for a, b in zip(by_sigma, by_sigma[1:]))


@pytest.mark.parametrize("conversion", list(Conversion))
def test_max_steps_within_is_the_boundary(conversion):
    kwargs = dict(sigma=2000.0, topk=300, queries_per_step=64, delta=1e-5,
                  conversion=conversion)
    steps = accounting.max_steps_within(max_eps=2.0, **kwargs)
    assert steps > 0
    assert accounting.epsilon_for(steps=steps, **kwargs).epsilon <= 2.0
    assert accounting.epsilon_for(steps=steps + 1, **kwargs).epsilon > 2.0
    # A budget too small for a single step allows none.
    assert accounting.max_steps_within(max_eps=1e-3, **kwargs) == 0


@pytest.mark.parametrize("conversion,target", [("classic", 1.0), ("dp_accounting", 1.0),
                                               ("dp_accounting", 8.0), ("classic", 0.2)])
def test_calibrate_sigma(conversion, target):
    kwargs = dict(topk=200, queries_per_step=30, steps=43, delta=1e-5,
                  conversion=conversion)
    sigma = accounting.calibrate_sigma(target_epsilon=target, **kwargs)
    assert accounting.epsilon_for(sigma=sigma, **kwargs).epsilon <= target
    assert accounting.epsilon_for(sigma=sigma * (1 - 1e-4), **kwargs).epsilon > target


def test_calibrate_sigma_golden_budget_is_below_the_authors_sigma():
    sigma = accounting.calibrate_sigma(target_epsilon=1.0, topk=200, queries_per_step=30,
                                       steps=43, delta=1e-5, conversion="classic")
    assert 4900.0 < sigma < 5000.0  # 5000 gives 0.9957 after 43 steps, 44 would exceed.


def test_calibrate_sigma_rejects_bad_targets():
    kwargs = dict(topk=200, queries_per_step=30, steps=43, delta=1e-5)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="target_epsilon") as info:
            accounting.calibrate_sigma(target_epsilon=bad, conversion="classic", **kwargs)
        assert repr(bad) in str(info.value)
    # The classic conversion cannot go below log(1/delta)/(max_order - 1).
    with pytest.raises(ValueError, match="unreachable"):
        accounting.calibrate_sigma(target_epsilon=0.05, conversion="classic", **kwargs)
    with pytest.raises(ValueError, match="steps=0"):
        accounting.calibrate_sigma(target_epsilon=1.0, conversion="classic", topk=200,
                                   queries_per_step=30, steps=0, delta=1e-5)


# --------------------------------------------------------------------------------------
# Invalid inputs.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,error,quoted", [
    (dict(sigma=0.0), ValueError, "0.0"),
    (dict(sigma=-5.0), ValueError, "-5.0"),
    (dict(sigma=float("inf")), ValueError, "inf"),
    (dict(topk=0), ValueError, "got 0"),
    (dict(topk=2.5), TypeError, "2.5"),
    (dict(topk=True), TypeError, "True"),
    (dict(delta=0.0), ValueError, "0.0"),
    (dict(delta=1.0), ValueError, "1.0"),
    (dict(steps=-1), ValueError, "-1"),
    (dict(queries_per_step=-30), ValueError, "-30"),
    (dict(conversion="renyi"), ValueError, "'renyi'"),
    (dict(orders=[1.0, 2.0]), ValueError, "1.0"),
])
def test_invalid_inputs_quote_the_value(kwargs, error, quoted):
    args = dict(sigma=5000.0, topk=200, queries_per_step=30, steps=43, delta=1e-5,
                conversion="classic")
    args.update(kwargs)
    with pytest.raises(error) as info:
        accounting.epsilon_for(**args)
    assert quoted in str(info.value)


def test_invalid_ledger_and_budget_inputs_quote_the_value():
    ledger = PrivacyLedger(delta=1e-5)
    with pytest.raises(ValueError, match="-1"):
        ledger.spend_topagg(sigma=5000.0, topk=200, queries=-1)
    with pytest.raises(ValueError, match="-1"):
        ledger.epsilon_after(sigma=5000.0, topk=200, queries=-1)
    with pytest.raises(ValueError, match="delta.*0"):
        PrivacyLedger(delta=0)
    with pytest.raises(ValueError, match="1"):
        PrivacyLedger(delta=1)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="max_eps") as info:
            accounting.max_steps_within(max_eps=bad, conversion="classic", **GOLDEN)
        assert repr(bad) in str(info.value)
    with pytest.raises(ValueError, match="max_order.*got 2"):
        accounting.classic_orders(2)
    with pytest.raises(TypeError, match="positional"):
        accounting.topagg_noise_multiplier(5000.0, 200)  # Keyword-only.


def test_importing_accounting_does_not_import_tensorflow():
    code = ("import sys, dclens.privacy.accounting; "
            "sys.exit(1 if 'tensorflow' in sys.modules or 'keras' in sys.modules else 0)")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


# --------------------------------------------------------------------------------------
# The command-line tool.
# --------------------------------------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess:
    # Run from outside the repo: the script must find dclens by itself.
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=60, cwd=REPO.parent)


def test_cli_golden_json():
    result = _cli("--sigma", "5000", "--topk", "200", "--queries_per_step", "30",
                  "--steps", "43", "--delta", "1e-5", "--conversion", "all", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["mode"] == "epsilon"
    classic = out["results"]["classic"]
    assert classic["conversion"] == "classic"
    assert classic["epsilon"] == pytest.approx(0.99570523, abs=1e-8)
    assert classic["order"] == 25.0
    assert out["results"]["dp_accounting"]["epsilon"] < classic["epsilon"]


def test_cli_max_eps_and_target_eps():
    common = ("--topk", "200", "--queries_per_step", "30", "--delta", "1e-5",
              "--conversion", "classic", "--orders", "200")
    result = _cli("--sigma", "5000", "--max_eps", "1", "--json", *common)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["results"]["classic"]["max_steps"] == 43
    result = _cli("--steps", "43", "--target_eps", "1", *common)
    assert result.returncode == 0, result.stderr
    assert "classic" in result.stdout and "sigma = 49" in result.stdout


def test_cli_human_readable_names_both_conversions():
    result = _cli("--sigma", "5000", "--topk", "200", "--queries_per_step", "30",
                  "--steps", "43", "--delta", "1e-5")
    assert result.returncode == 0, result.stderr
    assert "0.99570523" in result.stdout
    assert "classic" in result.stdout and "dp_accounting" in result.stdout


@pytest.mark.parametrize("args,quoted", [
    (("--sigma", "-1"), "-1.0"),
    (("--sigma", "5000", "--delta", "2"), "2.0"),
    (("--sigma", "5000", "--orders", "1"), "got 1"),
])
def test_cli_bad_value_exits_nonzero_quoting_it(args, quoted):
    base = {"--sigma": "5000", "--topk": "200", "--queries_per_step": "30",
            "--steps": "43", "--delta": "1e-5"}
    base.update(dict(zip(args[::2], args[1::2])))
    result = _cli(*[part for item in base.items() for part in item])
    assert result.returncode != 0
    assert quoted in result.stderr


# ------------------------------------------------------------------ release labels

@pytest.mark.parametrize("kwargs, expected", [
    (dict(epsilon=0.99571, delta=1e-5), "epsilon=0.996, delta=1e-05"),
    (dict(epsilon=0.99571, delta=1e-5, proven=False),
     "epsilon=0.996, delta=1e-05, NOT a proven guarantee"),
    (dict(epsilon=0.99571, delta=1e-5, seeded=True),
     "epsilon=0.996, delta=1e-05, seeded noise: NOT private"),
    (dict(epsilon=2.0, delta=1e-6, proven=False, seeded=True),
     "epsilon=2.000, delta=1e-06, NOT a proven guarantee, seeded noise: NOT private"),
    (dict(epsilon=None, delta=1e-5, proven=False), "no query made"),
    (dict(epsilon=3.0, delta=1e-5, non_private=True, seeded=True), "NOT PRIVATE"),
])
def test_guarantee_label_names_every_reason_an_epsilon_is_not_a_guarantee(kwargs, expected):
    epsilon, delta = kwargs.pop("epsilon"), kwargs.pop("delta")
    assert accounting.guarantee_label(epsilon, delta, **kwargs) == expected
