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
Two RDP conversions are offered, and every reported epsilon names the one it used
(:class:`Conversion`):

* ``dp_accounting``: ``dp_accounting.rdp.compute_epsilon`` (Proposition 12 of
  arXiv:2004.00010), tighter; default orders are dp_accounting's own.
* ``classic``: eps = min_alpha RDP(alpha) + log(1/delta) / (alpha - 1) (Mironov 2017,
  Proposition 3), the conversion the DataLens authors use, over orders
  {1.1, 2, 3, ..., 199} (their ``--orders 200``).

Beside them, ``pld`` uses no RDP: Q Gaussian mechanisms of multiplier z compose into one
Gaussian mechanism with mu = sqrt(Q) / z, whose exact (epsilon, delta) is the analytic
Gaussian mechanism's closed form (:mod:`dclens.privacy.exact`).  It is the exact
guarantee of the released votes, tighter than either conversion, so the same budget allows
more steps.

The RDP vector itself is always computed by ``dp_accounting.rdp.RdpAccountant`` composing
the corresponding ``DpEvent``. This module does not import TensorFlow and keeps no global
state.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import dp_accounting

from dclens.privacy import exact
from dclens.privacy.rdp_ledger import (CLASSIC_ORDERS, DP_ACCOUNTING_ORDERS, Conversion,
                                       EpsilonReport, RdpLedger, Run, check_count, check_int,
                                       check_noise_multiplier, check_positive, classic_orders,
                                       is_real)

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
    sigma = check_positive(
        "sigma", sigma,
        hint="it is the std of the Gaussian noise per vote coordinate; 0 gives no privacy")
    topk = check_int("topk", topk, minimum=1,
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
    queries = check_int("queries", queries, minimum=0,
                         hint="it counts TopAgg calls, one per fake image")
    event = dp_accounting.GaussianDpEvent(noise_multiplier=z)
    if queries == 1:
        return event
    return dp_accounting.SelfComposedDpEvent(event=event, count=queries)


def gaussian_queries_event(*, noise_multiplier: float, queries: int = 1
                           ) -> dp_accounting.DpEvent:
    """``queries`` adaptively composed Gaussian mechanisms with ``noise_multiplier``
    (noise std / L2 sensitivity): any aggregation of :class:`dclens.datalens.config.Aggregation`."""
    z = check_noise_multiplier(noise_multiplier)
    queries = check_int("queries", queries, minimum=0,
                         hint="it counts aggregation calls, one per fake image")
    event = dp_accounting.GaussianDpEvent(noise_multiplier=z)
    return event if queries == 1 else dp_accounting.SelfComposedDpEvent(event=event,
                                                                        count=queries)


def _gaussian_runs(event: Any, multiplier: int = 1) -> list[tuple[float, int]]:
    """Flattens Gaussian / SelfComposed / Composed events into (noise_multiplier, count)."""
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return [(check_noise_multiplier(event.noise_multiplier), multiplier)]
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        count = check_int("SelfComposedDpEvent.count", event.count, minimum=0)
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
# The ledger.
# --------------------------------------------------------------------------------------

class PrivacyLedger(RdpLedger):
    """The spends of a DataLens run: adaptively composed Gaussian mechanisms (TopAgg calls).

    Runs are ``(noise_multiplier z, count)``; the RDP after the record is
    sum_i count_i * alpha / (2 z_i^2), computed by ``dp_accounting.rdp.RdpAccountant``
    under replace-one adjacency, and epsilon is the guarantee for one training record at
    ``delta`` under ``conversion`` (:class:`dclens.privacy.rdp_ledger.RdpLedger` holds the
    plumbing shared with the subsampled ledger).

    The delta, the conversion and the orders are fixed at construction and stored in
    :meth:`state_dict` (orders explicitly, so that a restored ledger reports the same
    epsilon even if dp_accounting's defaults change).
    """

    STATE_KEYS = frozenset({"version", "delta", "conversion", "orders", "spends"})
    SPEND_KEYS = frozenset({"noise_multiplier", "count"})

    @property
    def relation(self) -> dp_accounting.NeighboringRelation:
        # The 2 sqrt(k) sensitivity bounds the change from replacing one record; Gaussian
        # RDP does not depend on the relation otherwise.
        return dp_accounting.NeighboringRelation.REPLACE_ONE

    def _runs_of(self, event: dp_accounting.DpEvent) -> list[Run]:
        return _gaussian_runs(event)

    def _event(self, runs: Sequence[Run]) -> dp_accounting.DpEvent:
        return dp_accounting.ComposedDpEvent(events=[
            dp_accounting.SelfComposedDpEvent(
                event=dp_accounting.GaussianDpEvent(noise_multiplier=z), count=count)
            for z, count in runs])

    def _pld_epsilon(self, runs: Sequence[Run]) -> float:
        # Unsampled Gaussians compose into one: the closed form is exact.
        return exact.gaussian_epsilon(exact.composed_mu(runs), self._delta)

    def _spend_state(self, run: Run) -> dict[str, Any]:
        z, count = run
        return {"noise_multiplier": z, "count": count}

    @classmethod
    def _run_from_state(cls, index: int, spend: Mapping[str, Any]) -> Run:
        return (check_noise_multiplier(spend["noise_multiplier"]),
                check_count(index, spend["count"]))

    def spend_topagg(self, *, sigma: float, topk: int, queries: int) -> None:
        """Records ``queries`` TopAgg calls with noise ``sigma`` and ``topk`` votes each.

        Args:
          sigma: noise standard deviation per coordinate, > 0.
          topk: votes per teacher, an integer >= 1 (L2 sensitivity 2 sqrt(topk)).
          queries: number of TopAgg calls (fake images aggregated), an integer >= 0.
        """
        self.spend(topagg_event(sigma=sigma, topk=topk, queries=queries))

    def epsilon_after(self, *, sigma: float, topk: int, queries: int) -> EpsilonReport:
        """What :meth:`epsilon` would report after ``spend_topagg(...)``, without spending.

        Used to stop training before the step that would exceed the budget.
        """
        return self.epsilon_after_event(topagg_event(sigma=sigma, topk=topk, queries=queries))

    def __repr__(self) -> str:
        return (f"PrivacyLedger(delta={self._delta!r}, "
                f"conversion={self._conversion.value!r}, {len(self._orders)} orders, "
                f"queries={self.queries})")


# --------------------------------------------------------------------------------------
# Planning helpers.
# --------------------------------------------------------------------------------------

def epsilon_for(*, sigma: float, topk: int, queries_per_step: int, steps: int,
                delta: float, conversion: Conversion | str = Conversion.DP_ACCOUNTING,
                orders: Sequence[float] | None = None,
                prior: Sequence[dp_accounting.DpEvent] = ()) -> EpsilonReport:
    """The guarantee after ``steps`` generator steps of ``queries_per_step`` TopAgg calls.

    RDP(alpha) = steps * queries_per_step * 2 topk alpha / sigma^2, converted at
    ``delta`` with ``conversion`` over ``orders`` (None: the conversion's default).
    ``prior``: Gaussian events spent before the first step (a warm start's release),
    composed with them.
    """
    ledger = PrivacyLedger(delta=delta, conversion=conversion, orders=orders)
    for event in prior:
        ledger.spend(event)
    queries_per_step = check_int("queries_per_step", queries_per_step, minimum=0,
                                  hint="it is the fake batch size (TopAgg calls per step)")
    steps = check_int("steps", steps, minimum=0)
    ledger.spend_topagg(sigma=sigma, topk=topk, queries=queries_per_step * steps)
    return ledger.epsilon()


def epsilon_curve(*, sigma: float, topk: int, queries_per_step: int, steps: int,
                  delta: float, conversion: Conversion | str,
                  orders: Sequence[float] | None = None) -> list[EpsilonReport]:
    """The guarantee after each of steps 1, 2, ..., ``steps`` (element i is after i+1).

    Element t-1 equals ``epsilon_for(..., steps=t)`` exactly.
    """
    ledger = PrivacyLedger(delta=delta, conversion=conversion, orders=orders)
    queries_per_step = check_int("queries_per_step", queries_per_step, minimum=0,
                                  hint="it is the fake batch size (TopAgg calls per step)")
    steps = check_int("steps", steps, minimum=0)
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
                     orders: Sequence[float] | None = None,
                     prior: Sequence[dp_accounting.DpEvent] = ()) -> int:
    """The largest number of steps whose epsilon is <= ``max_eps`` (0 if even one exceeds),
    after the ``prior`` events (:func:`epsilon_for`).

    Training that checks the budget before every step stops after exactly this many
    steps. Epsilon is non-decreasing in the number of steps (RDP grows linearly and both
    conversions are monotone in RDP), so this is an exponential then binary search.
    """
    max_eps = check_positive("max_eps", max_eps, hint="it is the epsilon budget")
    queries_per_step = check_int("queries_per_step", queries_per_step, minimum=1,
                                  hint="with 0 queries per step every number of steps fits")

    def within(steps: int) -> bool:
        return epsilon_for(sigma=sigma, topk=topk, queries_per_step=queries_per_step,
                           steps=steps, delta=delta, conversion=conversion,
                           orders=orders, prior=prior).epsilon <= max_eps

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
    target_epsilon = check_positive("target_epsilon", target_epsilon,
                                     hint="it is the epsilon budget to calibrate for")
    if not is_real(tol) or not 0 < tol < 1:
        raise ValueError(f"tol must be a relative tolerance in (0, 1), got {tol!r}; "
                         f"e.g. 1e-6.")
    topk = check_int("topk", topk, minimum=1,
                      hint="each teacher votes on topk gradient coordinates")
    queries_per_step = check_int("queries_per_step", queries_per_step, minimum=0,
                                  hint="it is the fake batch size (TopAgg calls per step)")
    steps = check_int("steps", steps, minimum=0)
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

