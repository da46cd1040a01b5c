"""Privacy accounting for DataLens' TopAgg aggregation, on top of ``dp_accounting``.

The mechanism
-------------
Each TopAgg call aggregates, for ONE fake image, the votes of the N teachers. Each
teacher votes on exactly ``topk`` = k gradient coordinates with values in {-1, +1} (0
elsewhere), and N(0, sigma^2) noise is added to every coordinate of the sum.

Unit of privacy: one training record, under **replace-one** adjacency (REPLACE_ONE in
the DP events). The teachers are trained on disjoint partitions of a data-independent
permutation of the record *indices* (:func:`dclens.data.index_partition`), so replacing one
record changes at most one teacher, whose vote vector may change from any k-sparse
{-1, +1} vector to any other. Adding or removing a record is not covered: it shifts every
later index and so can move records between teachers. Where a loader filters records
(CelebA-Hair keeps those with exactly one hair attribute), the unit is one record of the
filtered set. The L2 sensitivity of
the summed votes is therefore 2 * sqrt(k) (flipping all k votes), and one call is a
Gaussian mechanism with noise multiplier

    z = sigma / (2 * sqrt(k)),      RDP(alpha) = alpha / (2 z^2) = 2 k alpha / sigma^2.

A generator step with a fake batch of B images makes B calls (B "queries"); queries and
steps compose adaptively, so after Q queries in total RDP(alpha) = Q * 2 k alpha / sigma^2.

RDP -> (epsilon, delta)
-----------------------
Two conversions are offered, and every reported epsilon names the one it used
(:class:`Conversion`):

* ``dp_accounting``: ``dp_accounting.rdp.compute_epsilon`` (Proposition 12 of
  arXiv:2004.00010), tighter; default orders are dp_accounting's own.
* ``classic``: eps = min_alpha RDP(alpha) + log(1/delta) / (alpha - 1) (Mironov 2017,
  Proposition 3), the conversion the DataLens authors use, over orders
  {1.1, 2, 3, ..., 199} (their ``--orders 200``).

The RDP vector itself is always computed by ``dp_accounting.rdp.RdpAccountant`` composing
the corresponding ``DpEvent``. This module does not import TensorFlow and keeps no global
state.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
from typing import Any, Mapping, Sequence

import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant
import numpy as np

__all__ = [
    "CLASSIC_ORDERS",
    "Conversion",
    "DP_ACCOUNTING_ORDERS",
    "EpsilonReport",
    "PrivacyLedger",
    "calibrate_sigma",
    "classic_orders",
    "epsilon_curve",
    "epsilon_for",
    "max_steps_within",
    "topagg_event",
    "topagg_noise_multiplier",
]


class Conversion(enum.Enum):
    """RDP -> (epsilon, delta) conversion; every reported epsilon names the one it used."""

    #: ``dp_accounting.rdp.compute_epsilon`` (tighter).
    DP_ACCOUNTING = "dp_accounting"
    #: eps = min_alpha RDP(alpha) + log(1/delta) / (alpha - 1), the DataLens authors' one.
    CLASSIC = "classic"


# --------------------------------------------------------------------------------------
# Validation. Every error quotes the bad value and says what to do.
# --------------------------------------------------------------------------------------

def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_int(name: str, value: Any, *, minimum: int, hint: str = "") -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer >= {minimum}, got {value!r} "
                        f"({type(value).__name__}){'; ' + hint if hint else ''}.")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}"
                         f"{'; ' + hint if hint else ''}.")
    return int(value)


def _check_positive(name: str, value: Any, *, hint: str = "") -> float:
    if not _is_real(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}"
                         f"{'; ' + hint if hint else ''}.")
    return float(value)


def _check_delta(delta: Any) -> float:
    if not _is_real(delta) or not 0 < delta < 1:
        raise ValueError(
            f"delta must be a number in the open interval (0, 1), got {delta!r}; use a "
            "delta well below 1/(number of training records), e.g. 1e-5.")
    return float(delta)


def _check_conversion(conversion: Any) -> Conversion:
    # Any enum with a matching value (e.g. a config-level twin of Conversion) is accepted.
    value = conversion.value if isinstance(conversion, enum.Enum) else conversion
    try:
        return Conversion(value)
    except ValueError:
        names = ", ".join(repr(c.value) for c in Conversion)
        raise ValueError(
            f"conversion must be one of {names} (or a Conversion member), got "
            f"{conversion!r}.") from None


def _check_orders(orders: Sequence[float] | None,
                  conversion: Conversion) -> tuple[float, ...]:
    if orders is None:
        return CLASSIC_ORDERS if conversion is Conversion.CLASSIC else DP_ACCOUNTING_ORDERS
    if isinstance(orders, (str, bytes)) or not isinstance(orders, (Sequence, np.ndarray)):
        raise TypeError(f"orders must be a sequence of RDP orders > 1, got {orders!r}; "
                        "pass None for the conversion's default orders.")
    if len(orders) == 0:
        raise ValueError("orders must not be empty; pass None for the conversion's "
                         "default orders.")
    for order in orders:
        if not _is_real(order) or not math.isfinite(order) or order <= 1:
            raise ValueError(
                f"every RDP order must be a finite number > 1, got {order!r} in orders; "
                "order 1 gives no bound, use e.g. classic_orders(200).")
    return tuple(float(order) for order in orders)


def _check_noise_multiplier(value: Any) -> float:
    return _check_positive(
        "noise_multiplier", value,
        hint="a zero or infinite noise multiplier is not a private Gaussian mechanism")


def classic_orders(max_order: int = 200) -> tuple[float, ...]:
    """RDP orders of the DataLens authors' ``--orders`` flag: 1.1, 2, 3, ..., max_order - 1.

    Args:
      max_order: the value of the authors' ``--orders`` flag, an integer >= 3.

    Returns:
      The orders as floats, ``(1.1,) + tuple(range(2, max_order))``.

    Raises:
      TypeError: if ``max_order`` is not an integer.
      ValueError: if ``max_order`` < 3.
    """
    max_order = _check_int("max_order", max_order, minimum=3,
                           hint="it is the authors' --orders flag, e.g. 200")
    return (1.1,) + tuple(float(a) for a in range(2, max_order))


#: The DataLens authors' orders, {1.1, 2, ..., 199}: the default for ``Conversion.CLASSIC``.
CLASSIC_ORDERS: tuple[float, ...] = classic_orders(200)

#: ``dp_accounting``'s default RDP orders: the default for ``Conversion.DP_ACCOUNTING``.
DP_ACCOUNTING_ORDERS: tuple[float, ...] = tuple(
    float(a) for a in rdp_privacy_accountant.DEFAULT_RDP_ORDERS)


# --------------------------------------------------------------------------------------
# The TopAgg mechanism as a DpEvent.
# --------------------------------------------------------------------------------------

def topagg_noise_multiplier(*, sigma: float, topk: int) -> float:
    """Noise multiplier of one TopAgg call: z = sigma / (2 sqrt(k)).

    Args:
      sigma: standard deviation of the Gaussian noise added to every coordinate of the
        summed votes (in vote units), > 0.
      topk: k, the number of coordinates each teacher votes on, an integer >= 1. The L2
        sensitivity of the summed votes to one training record is 2 sqrt(k).

    Returns:
      sigma / (2 sqrt(k)), the noise standard deviation in units of the L2 sensitivity.

    Raises:
      ValueError: if sigma is not a finite number > 0 or topk < 1.
      TypeError: if topk is not an integer.
    """
    sigma = _check_positive(
        "sigma", sigma,
        hint="it is the std of the Gaussian noise per vote coordinate; 0 gives no privacy")
    topk = _check_int("topk", topk, minimum=1,
                      hint="each teacher votes on topk gradient coordinates")
    return sigma / (2.0 * math.sqrt(topk))


def topagg_event(*, sigma: float, topk: int, queries: int = 1) -> dp_accounting.DpEvent:
    """The ``DpEvent`` of ``queries`` adaptively composed TopAgg calls.

    Args:
      sigma: noise standard deviation per coordinate, > 0.
      topk: votes per teacher, an integer >= 1.
      queries: number of TopAgg calls (one per fake image), an integer >= 0.

    Returns:
      ``GaussianDpEvent(z)`` if ``queries == 1``, else
      ``SelfComposedDpEvent(GaussianDpEvent(z), queries)``, with
      z = sigma / (2 sqrt(topk)).
    """
    z = topagg_noise_multiplier(sigma=sigma, topk=topk)
    queries = _check_int("queries", queries, minimum=0,
                         hint="it counts TopAgg calls, one per fake image")
    event = dp_accounting.GaussianDpEvent(noise_multiplier=z)
    if queries == 1:
        return event
    return dp_accounting.SelfComposedDpEvent(event=event, count=queries)


def gaussian_queries_event(*, noise_multiplier: float, queries: int = 1
                           ) -> dp_accounting.DpEvent:
    """``queries`` adaptively composed Gaussian mechanisms with ``noise_multiplier``
    (noise std / L2 sensitivity): any aggregation of :class:`dclens.datalens.config.Aggregation`."""
    z = _check_noise_multiplier(noise_multiplier)
    queries = _check_int("queries", queries, minimum=0,
                         hint="it counts aggregation calls, one per fake image")
    event = dp_accounting.GaussianDpEvent(noise_multiplier=z)
    return event if queries == 1 else dp_accounting.SelfComposedDpEvent(event=event,
                                                                        count=queries)


def _gaussian_runs(event: Any, multiplier: int = 1) -> list[tuple[float, int]]:
    """Flattens Gaussian / SelfComposed / Composed events into (noise_multiplier, count)."""
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return [(_check_noise_multiplier(event.noise_multiplier), multiplier)]
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        count = _check_int("SelfComposedDpEvent.count", event.count, minimum=0)
        return _gaussian_runs(event.event, multiplier * count)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        runs: list[tuple[float, int]] = []
        for sub_event in event.events:
            runs.extend(_gaussian_runs(sub_event, multiplier))
        return runs
    raise TypeError(
        f"PrivacyLedger can only record GaussianDpEvent, or SelfComposedDpEvent / "
        f"ComposedDpEvent built from GaussianDpEvents (so that the ledger can be "
        f"serialised), got {type(event).__name__}: {event!r}. Express the spend as "
        f"Gaussian events (e.g. topagg_event(...)), or account for it with a "
        f"dp_accounting accountant directly.")


# --------------------------------------------------------------------------------------
# RDP -> epsilon.
# --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class EpsilonReport:
    """An (epsilon, delta)-DP guarantee and how it was obtained.

    Attributes:
      epsilon: the epsilon of the guarantee, for one training record (see module doc).
      order: the RDP order alpha at which the conversion attained ``epsilon``.
      delta: the delta of the guarantee.
      conversion: the RDP -> (epsilon, delta) conversion used.
    """

    epsilon: float
    order: float
    delta: float
    conversion: Conversion

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form; ``conversion`` is its string value."""
        return {"epsilon": self.epsilon, "order": self.order, "delta": self.delta,
                "conversion": self.conversion.value}

    def __str__(self) -> str:
        return (f"epsilon = {self.epsilon:.8f} at delta = {self.delta:g} "
                f"({self.conversion.value} conversion, optimal order {self.order:g})")


def _classic_epsilon(orders: np.ndarray, rdp: np.ndarray,
                     delta: float) -> tuple[float, float]:
    """eps = min_alpha rdp(alpha) + log(1/delta) / (alpha - 1), and the minimising alpha.

    With nothing spent (all RDP exactly 0) nothing was released, so the guarantee is
    (0, 0)-DP: returns epsilon 0 at the first order, as ``dp_accounting`` does.
    """
    if not np.any(rdp):
        return 0.0, float(orders[0])
    eps = rdp - math.log(delta) / (orders - 1.0)
    index = int(np.argmin(eps))
    return float(eps[index]), float(orders[index])


def _rdp_accountant(runs: Sequence[tuple[float, int]],
                    orders: Sequence[float]) -> dp_accounting.rdp.RdpAccountant:
    """An ``RdpAccountant`` that has composed the runs (noise_multiplier, count)."""
    accountant = dp_accounting.rdp.RdpAccountant(
        orders=list(orders),
        # The 2 sqrt(k) sensitivity bounds the change from replacing one record; Gaussian
        # RDP does not depend on the relation otherwise.
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(_runs_event(runs))
    return accountant


def _runs_event(runs: Sequence[tuple[float, int]]) -> dp_accounting.DpEvent:
    return dp_accounting.ComposedDpEvent(events=[
        dp_accounting.SelfComposedDpEvent(
            event=dp_accounting.GaussianDpEvent(noise_multiplier=z), count=count)
        for z, count in runs])


def _report(runs: Sequence[tuple[float, int]], *, orders: Sequence[float], delta: float,
            conversion: Conversion) -> EpsilonReport:
    accountant = _rdp_accountant(runs, orders)
    if conversion is Conversion.DP_ACCOUNTING:
        epsilon, order = accountant.get_epsilon_and_optimal_order(delta)
    else:
        epsilon, order = _classic_epsilon(accountant.orders, accountant.rdp, delta)
    return EpsilonReport(epsilon=float(epsilon), order=float(order), delta=delta,
                         conversion=conversion)


def _append_run(runs: list[tuple[float, int]], noise_multiplier: float,
                count: int) -> None:
    """Appends a run, merging it into the last one if the noise multiplier is the same.

    RDP composes additively, so merging changes nothing, and it keeps the record of a
    run at constant sigma one entry long however many steps it takes; it also makes
    spending q1 then q2 exactly (bitwise) the same as spending q1 + q2.
    """
    if count == 0:
        return
    if runs and runs[-1][0] == noise_multiplier:
        runs[-1] = (noise_multiplier, runs[-1][1] + count)
    else:
        runs.append((noise_multiplier, count))


# --------------------------------------------------------------------------------------
# The ledger.
# --------------------------------------------------------------------------------------

_STATE_VERSION = 1
_STATE_KEYS = frozenset({"version", "delta", "conversion", "orders", "spends"})
_SPEND_KEYS = frozenset({"noise_multiplier", "count"})


class PrivacyLedger:
    """Composes the DP events spent by a run.

    Keeps a serialisable record of every spend so it survives checkpoints: the record is
    the run-length encoded sequence of Gaussian mechanisms spent, each entry a noise
    multiplier z (noise std over L2 sensitivity) and a count of adaptive invocations.
    The RDP after the record is sum_i count_i * alpha / (2 z_i^2), computed by
    ``dp_accounting.rdp.RdpAccountant``, and epsilon is the guarantee for one training
    record at ``delta`` under ``conversion``.

    The delta, the conversion and the orders are fixed at construction and stored in
    :meth:`state_dict` (orders explicitly, so that a restored ledger reports the same
    epsilon even if dp_accounting's defaults change).
    """

    def __init__(self, *, delta: float,
                 conversion: Conversion | str = Conversion.DP_ACCOUNTING,
                 orders: Sequence[float] | None = None) -> None:
        """Initialises an empty ledger.

        Args:
          delta: the delta of every reported (epsilon, delta) guarantee, in (0, 1).
          conversion: the RDP -> (epsilon, delta) conversion (a :class:`Conversion` or its
            value, "dp_accounting" or "classic").
          orders: RDP orders, each finite and > 1. None means :data:`CLASSIC_ORDERS` for
            the classic conversion and :data:`DP_ACCOUNTING_ORDERS` for dp_accounting's.
        """
        self._delta = _check_delta(delta)
        self._conversion = _check_conversion(conversion)
        self._orders = _check_orders(orders, self._conversion)
        self._runs: list[tuple[float, int]] = []

    @property
    def delta(self) -> float:
        """The delta of every reported guarantee."""
        return self._delta

    @property
    def conversion(self) -> Conversion:
        """The RDP -> (epsilon, delta) conversion."""
        return self._conversion

    @property
    def orders(self) -> tuple[float, ...]:
        """The RDP orders alpha at which RDP is tracked."""
        return self._orders

    @property
    def queries(self) -> int:
        """Total number of Gaussian mechanism invocations (TopAgg queries) spent."""
        return sum(count for _, count in self._runs)

    def spend_topagg(self, *, sigma: float, topk: int, queries: int) -> None:
        """Records ``queries`` TopAgg calls with noise ``sigma`` and ``topk`` votes each.

        Args:
          sigma: noise standard deviation per coordinate, > 0.
          topk: votes per teacher, an integer >= 1 (L2 sensitivity 2 sqrt(topk)).
          queries: number of TopAgg calls (fake images aggregated), an integer >= 0.
        """
        z = topagg_noise_multiplier(sigma=sigma, topk=topk)
        queries = _check_int("queries", queries, minimum=0,
                             hint="it counts TopAgg calls, one per fake image")
        _append_run(self._runs, z, queries)

    def spend(self, event: dp_accounting.DpEvent) -> None:
        """Records a generic event: Gaussian, or Self-/Composed events of Gaussians.

        The event is validated as a whole before anything is recorded.

        Raises:
          TypeError: for any other event type (it could not be serialised).
          ValueError: for a Gaussian event whose noise multiplier is not finite and > 0,
            or a negative count.
        """
        runs = _gaussian_runs(event)
        for z, count in runs:
            _append_run(self._runs, z, count)

    def dp_event(self) -> dp_accounting.DpEvent:
        """Everything spent so far as one ``DpEvent`` (e.g. for another accountant)."""
        return _runs_event(self._runs)

    def rdp(self) -> np.ndarray:
        """The RDP epsilon at each of :attr:`orders`, for one training record."""
        return _rdp_accountant(self._runs, self._orders).rdp

    def epsilon(self) -> EpsilonReport:
        """The (epsilon, delta) guarantee of everything spent so far."""
        return _report(self._runs, orders=self._orders, delta=self._delta,
                       conversion=self._conversion)

    def epsilon_after(self, *, sigma: float, topk: int, queries: int) -> EpsilonReport:
        """What :meth:`epsilon` would report after ``spend_topagg(...)``, without spending.

        Used to stop training before the step that would exceed the budget.
        """
        z = topagg_noise_multiplier(sigma=sigma, topk=topk)
        queries = _check_int("queries", queries, minimum=0,
                             hint="it counts TopAgg calls, one per fake image")
        runs = list(self._runs)
        _append_run(runs, z, queries)
        return _report(runs, orders=self._orders, delta=self._delta,
                       conversion=self._conversion)

    def epsilon_after_event(self, event: dp_accounting.DpEvent) -> EpsilonReport:
        """What :meth:`epsilon` would report after ``spend(event)``, without spending."""
        runs = list(self._runs)
        for z, count in _gaussian_runs(event):
            _append_run(runs, z, count)
        return _report(runs, orders=self._orders, delta=self._delta,
                       conversion=self._conversion)

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot; :meth:`from_state_dict` restores it exactly."""
        return {
            "version": _STATE_VERSION,
            "delta": self._delta,
            "conversion": self._conversion.value,
            "orders": list(self._orders),
            "spends": [{"noise_multiplier": z, "count": count} for z, count in self._runs],
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> PrivacyLedger:
        """Rebuilds a ledger from :meth:`state_dict`; it reports the identical epsilon.

        Raises:
          ValueError / TypeError: if the state is malformed or has been tampered with
            (missing or unknown keys, unknown conversion or version, invalid delta or
            orders, a noise multiplier that is not finite and > 0, a count that is not a
            positive integer).
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"PrivacyLedger state must be a mapping from state_dict(), "
                            f"got {type(state).__name__}: {state!r}.")
        keys = set(state)
        if keys != _STATE_KEYS:
            raise ValueError(
                f"PrivacyLedger state must have exactly the keys {sorted(_STATE_KEYS)}; "
                f"missing {sorted(_STATE_KEYS - keys)}, unknown "
                f"{sorted(map(str, keys - _STATE_KEYS))}. Restore it from an unmodified "
                f"state_dict().")
        if state["version"] != _STATE_VERSION or isinstance(state["version"], bool):
            raise ValueError(f"PrivacyLedger state version must be {_STATE_VERSION}, got "
                             f"{state['version']!r}; it was written by an incompatible "
                             f"version of dclens.")
        if not isinstance(state["orders"], (list, tuple)):
            raise TypeError(f"PrivacyLedger state 'orders' must be a list, got "
                            f"{state['orders']!r}.")
        ledger = cls(delta=state["delta"], conversion=state["conversion"],
                     orders=state["orders"])
        spends = state["spends"]
        if not isinstance(spends, (list, tuple)):
            raise TypeError(f"PrivacyLedger state 'spends' must be a list, got {spends!r}.")
        for i, spend in enumerate(spends):
            if not isinstance(spend, Mapping) or set(spend) != _SPEND_KEYS:
                raise ValueError(f"PrivacyLedger state spends[{i}] must be a mapping with "
                                 f"exactly the keys {sorted(_SPEND_KEYS)}, got {spend!r}.")
            z = _check_noise_multiplier(spend["noise_multiplier"])
            count = _check_int(f"spends[{i}]['count']", spend["count"], minimum=1,
                               hint="the ledger never records empty or negative spends")
            _append_run(ledger._runs, z, count)
        return ledger

    def __repr__(self) -> str:
        return (f"PrivacyLedger(delta={self._delta!r}, "
                f"conversion={self._conversion.value!r}, {len(self._orders)} orders, "
                f"queries={self.queries})")


# --------------------------------------------------------------------------------------
# Planning helpers.
# --------------------------------------------------------------------------------------

def epsilon_for(*, sigma: float, topk: int, queries_per_step: int, steps: int,
                delta: float, conversion: Conversion | str = Conversion.DP_ACCOUNTING,
                orders: Sequence[float] | None = None) -> EpsilonReport:
    """The guarantee after ``steps`` generator steps of ``queries_per_step`` TopAgg calls.

    RDP(alpha) = steps * queries_per_step * 2 topk alpha / sigma^2, converted at
    ``delta`` with ``conversion`` over ``orders`` (None: the conversion's default).
    """
    ledger = PrivacyLedger(delta=delta, conversion=conversion, orders=orders)
    queries_per_step = _check_int("queries_per_step", queries_per_step, minimum=0,
                                  hint="it is the fake batch size (TopAgg calls per step)")
    steps = _check_int("steps", steps, minimum=0)
    ledger.spend_topagg(sigma=sigma, topk=topk, queries=queries_per_step * steps)
    return ledger.epsilon()


def epsilon_curve(*, sigma: float, topk: int, queries_per_step: int, steps: int,
                  delta: float, conversion: Conversion | str,
                  orders: Sequence[float] | None = None) -> list[EpsilonReport]:
    """The guarantee after each of steps 1, 2, ..., ``steps`` (element i is after i+1).

    Element t-1 equals ``epsilon_for(..., steps=t)`` exactly.
    """
    ledger = PrivacyLedger(delta=delta, conversion=conversion, orders=orders)
    queries_per_step = _check_int("queries_per_step", queries_per_step, minimum=0,
                                  hint="it is the fake batch size (TopAgg calls per step)")
    steps = _check_int("steps", steps, minimum=0)
    topagg_noise_multiplier(sigma=sigma, topk=topk)  # Validate even when steps == 0.
    curve = []
    for _ in range(steps):
        ledger.spend_topagg(sigma=sigma, topk=topk, queries=queries_per_step)
        curve.append(ledger.epsilon())
    return curve


_MAX_STEPS_SEARCHED = 2**62
_MAX_BRACKET_DOUBLINGS = 1000


def max_steps_within(*, sigma: float, topk: int, queries_per_step: int, max_eps: float,
                     delta: float, conversion: Conversion | str,
                     orders: Sequence[float] | None = None) -> int:
    """The largest number of steps whose epsilon is <= ``max_eps`` (0 if even one exceeds).

    Training that checks the budget before every step stops after exactly this many
    steps. Epsilon is non-decreasing in the number of steps (RDP grows linearly and both
    conversions are monotone in RDP), so this is an exponential then binary search.
    """
    max_eps = _check_positive("max_eps", max_eps, hint="it is the epsilon budget")
    queries_per_step = _check_int("queries_per_step", queries_per_step, minimum=1,
                                  hint="with 0 queries per step every number of steps fits")

    def within(steps: int) -> bool:
        return epsilon_for(sigma=sigma, topk=topk, queries_per_step=queries_per_step,
                           steps=steps, delta=delta, conversion=conversion,
                           orders=orders).epsilon <= max_eps

    if not within(1):
        return 0
    low, high = 1, 2  # within(low) holds; high is a candidate upper bound.
    while within(high):
        low, high = high, 2 * high
        if high > _MAX_STEPS_SEARCHED:
            raise ValueError(f"more than {_MAX_STEPS_SEARCHED} steps fit within "
                             f"max_eps={max_eps!r} with sigma={sigma!r}; sigma is too "
                             f"large for this budget to bound training.")
    while high - low > 1:  # Invariant: within(low) and not within(high).
        mid = (low + high) // 2
        if within(mid):
            low = mid
        else:
            high = mid
    return low


def calibrate_sigma(*, target_epsilon: float, topk: int, queries_per_step: int,
                    steps: int, delta: float, conversion: Conversion | str,
                    orders: Sequence[float] | None = None, tol: float = 1e-6) -> float:
    """The smallest sigma whose epsilon after ``steps`` steps is <= ``target_epsilon``.

    Epsilon is strictly decreasing in sigma wherever it is positive, so sigma is found by
    bisection to relative precision ``tol``: the returned sigma satisfies the target and
    sigma * (1 - tol) (up to rounding) does not.

    The classic conversion never goes below log(1/delta) / (max_order - 1), whatever the
    noise; a target at or below that floor is an error.

    Raises:
      ValueError: if target_epsilon is not > 0, the target is unreachable, no query is
        made (steps * queries_per_step == 0), or tol is not in (0, 1).
    """
    target_epsilon = _check_positive("target_epsilon", target_epsilon,
                                     hint="it is the epsilon budget to calibrate for")
    if not _is_real(tol) or not 0 < tol < 1:
        raise ValueError(f"tol must be a relative tolerance in (0, 1), got {tol!r}; "
                         f"e.g. 1e-6.")
    topk = _check_int("topk", topk, minimum=1,
                      hint="each teacher votes on topk gradient coordinates")
    queries_per_step = _check_int("queries_per_step", queries_per_step, minimum=0,
                                  hint="it is the fake batch size (TopAgg calls per step)")
    steps = _check_int("steps", steps, minimum=0)
    if queries_per_step * steps == 0:
        raise ValueError(f"steps * queries_per_step must be >= 1 to calibrate sigma, got "
                         f"steps={steps!r}, queries_per_step={queries_per_step!r}; with no "
                         f"query any sigma gives epsilon 0.")
    ledger = PrivacyLedger(delta=delta, conversion=conversion, orders=orders)
    if ledger.conversion is Conversion.CLASSIC:
        floor = min(-math.log(ledger.delta) / (a - 1.0) for a in ledger.orders)
        if target_epsilon <= floor:
            raise ValueError(
                f"target_epsilon={target_epsilon!r} is unreachable with the classic "
                f"conversion at delta={ledger.delta!r}: over these orders epsilon is "
                f"always > log(1/delta)/(max_order - 1) = {floor:.6g}, however large "
                f"sigma is. Raise target_epsilon, use larger orders, or use "
                f"conversion='dp_accounting'.")

    def feasible(sigma: float) -> bool:
        return epsilon_for(sigma=sigma, topk=topk, queries_per_step=queries_per_step,
                           steps=steps, delta=ledger.delta, conversion=ledger.conversion,
                           orders=ledger.orders).epsilon <= target_epsilon

    # Bracket: low infeasible, high feasible, starting from noise multiplier 1.
    low = high = 2.0 * math.sqrt(topk)
    for _ in range(_MAX_BRACKET_DOUBLINGS):
        if feasible(high):
            break
        low, high = high, 2.0 * high
    else:
        raise ValueError(f"no sigma up to {high:.3g} reaches target_epsilon="
                         f"{target_epsilon!r}; raise the target.")
    if low == high:  # The starting sigma was feasible already: search downwards.
        for _ in range(_MAX_BRACKET_DOUBLINGS):
            low = 0.5 * high
            if not feasible(low):
                break
            high = low
        else:
            raise ValueError(f"every sigma down to {low:.3g} meets target_epsilon="
                             f"{target_epsilon!r}; check the target.")
    while high - low > tol * high:  # Invariant: not feasible(low) and feasible(high).
        mid = 0.5 * (low + high)
        if feasible(mid):
            high = mid
        else:
            low = mid
    return high


def guarantee_label(epsilon: float | None, delta: float, *, non_private: bool = False,
                    proven: bool = True, seeded: bool = False) -> str:
    """How a released artifact (a sample grid's title, a log line) states its privacy.

    The epsilon alone is a guarantee only when the accounting is proven and the noise
    was drawn from OS entropy; every reason it is not is named beside it, so a figure
    cut out of a run still carries its caveats:

    * ``non_private``: ``"NOT PRIVATE"`` (no noise, no budget);
    * ``epsilon is None``: ``"no query made"`` (nothing was released from the data);
    * ``proven=False`` (an accounting no proof supports, e.g. the class-balanced
      partition or FetchSGD's authors' sensitivity): ``"NOT a proven guarantee"``;
    * ``seeded=True`` (``--seed`` fixes the DP noise, which anyone with the seed can
      subtract): ``"seeded noise: NOT private"``.
    """
    if non_private:
        return "NOT PRIVATE"
    if epsilon is None:
        return "no query made"
    return f"epsilon={epsilon:.3f}, delta={delta:g}" + guarantee_caveats(proven=proven,
                                                                         seeded=seeded)


def guarantee_caveats(*, proven: bool, seeded: bool) -> str:
    """The reasons an epsilon is not a guarantee, as a suffix (``""`` when it is one)."""
    return ((", NOT a proven guarantee" if not proven else "")
            + (", seeded noise: NOT private" if seeded else ""))


#: What every run's epsilon does not cover: how its settings were chosen.  dclens' defaults
#: for DataLens and GS-WGAN are their papers', which the papers' authors chose on these
#: datasets' training sets, i.e. on the records a run treats as private.
HYPERPARAMETER_SELECTION = (
    "not covered by epsilon: the settings are taken as given. dclens' defaults are the "
    "papers' configurations, chosen by their authors on these datasets' training sets "
    "(the records a run treats as private); a setting chosen by looking at results on "
    "the private data leaks through that choice, outside this ledger.")

