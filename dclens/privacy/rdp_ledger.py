"""What every dclens privacy ledger shares: Gaussian spends composed in RDP, then converted.

A ledger records spends as run-length encoded runs ``(*key, count)``: ``count`` identical
mechanisms in a row, identified by ``key`` (the noise multiplier z for TopAgg's Gaussian
mechanism, ``(rate, z)`` for a subsampled Gaussian step).  RDP composes additively, so
merging a run into the previous one when the key is the same changes nothing; it keeps a
run at constant settings one entry long however many steps it takes, and makes spending
q1 then q2 bitwise the same as spending q1 + q2.

The RDP vector is computed by ``dp_accounting.rdp.RdpAccountant`` composing the runs'
``DpEvent`` under the ledger's neighbouring relation, and converted to (epsilon, delta)
by one of two conversions, or not converted from RDP at all (:class:`Conversion`):

* ``dp_accounting``: ``dp_accounting.rdp.compute_epsilon`` (Proposition 12 of
  arXiv:2004.00010), tighter; default orders are dp_accounting's own.
* ``classic``: eps = min_alpha RDP(alpha) + log(1/delta) / (alpha - 1) (Mironov 2017,
  Proposition 3), the conversion the DataLens authors use, over orders
  {1.1, 2, 3, ..., 199} (their ``--orders 200``).
* ``pld``: the privacy loss distribution of the composition, no RDP
  (:mod:`dclens.privacy.exact`): exact for DataLens' unsampled Gaussians, dp_accounting's
  pessimistic PLD accountant for Poisson-sampled steps.

A ledger's :meth:`RdpLedger.state_dict` is JSON, and :meth:`RdpLedger.from_state_dict`
restores the identical epsilon or refuses a malformed or edited state by name.  The
mechanisms themselves (what a spend is, its sensitivity, its unit of privacy) are the
subclasses': :class:`dclens.privacy.accounting.PrivacyLedger` (TopAgg) and
:class:`dclens.privacy.sampled_ledger.SampledGaussianLedger` (DP-SGD, GEP, GS-WGAN).
This module does not import TensorFlow and touches no files.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import enum
import logging
import math
import numbers
from typing import Any, ClassVar, Iterator, Mapping, Sequence

import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant
import numpy as np

STATE_VERSION = 1

Run = tuple  # (*key, count)


class Conversion(enum.Enum):
    """How a ledger turns its spends into (epsilon, delta); every reported epsilon names
    the one it used."""

    #: RDP, then ``dp_accounting.rdp.compute_epsilon`` (tighter than classic).
    DP_ACCOUNTING = "dp_accounting"
    #: RDP, then eps = min_alpha RDP(alpha) + log(1/delta) / (alpha - 1), the DataLens
    #: authors' conversion.
    CLASSIC = "classic"
    #: No RDP: the privacy loss distribution of the composition (:mod:`dclens.privacy.exact`).
    #: Exact for unsampled Gaussians (closed form); for Poisson-sampled ones
    #: dp_accounting's pessimistic PLD accountant.  The tightest of the three.
    PLD = "pld"

    @property
    def uses_rdp(self) -> bool:
        """Whether epsilon is converted from an RDP curve (and so has an optimal order)."""
        return self is not Conversion.PLD


# --------------------------------------------------------------------------------------
# Argument checks (every message quotes the bad value and says what a good one is).
# --------------------------------------------------------------------------------------

def is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(name: str, value: Any, *, minimum: int, hint: str = "") -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer >= {minimum}, got {value!r} "
                        f"({type(value).__name__}){'; ' + hint if hint else ''}.")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}"
                         f"{'; ' + hint if hint else ''}.")
    return int(value)


def check_positive(name: str, value: Any, *, hint: str = "") -> float:
    if not is_real(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}"
                         f"{'; ' + hint if hint else ''}.")
    return float(value)


def check_delta(delta: Any) -> float:
    if not is_real(delta) or not 0 < delta < 1:
        raise ValueError(
            f"delta must be a number in the open interval (0, 1), got {delta!r}; use a "
            "delta well below 1/(number of training records), e.g. 1e-5.")
    return float(delta)


def check_conversion(conversion: Any) -> Conversion:
    # Any enum with a matching value (e.g. a config-level twin of Conversion) is accepted.
    value = conversion.value if isinstance(conversion, enum.Enum) else conversion
    try:
        return Conversion(value)
    except ValueError:
        names = ", ".join(repr(c.value) for c in Conversion)
        raise ValueError(
            f"conversion must be one of {names} (or a Conversion member), got "
            f"{conversion!r}.") from None


def check_noise_multiplier(value: Any) -> float:
    return check_positive(
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
    max_order = check_int("max_order", max_order, minimum=3,
                          hint="it is the authors' --orders flag, e.g. 200")
    return (1.1,) + tuple(float(a) for a in range(2, max_order))


#: The DataLens authors' orders, {1.1, 2, ..., 199}: the default for ``Conversion.CLASSIC``.
CLASSIC_ORDERS: tuple[float, ...] = classic_orders(200)

#: ``dp_accounting``'s default RDP orders: the default for ``Conversion.DP_ACCOUNTING``.
DP_ACCOUNTING_ORDERS: tuple[float, ...] = tuple(
    float(a) for a in rdp_privacy_accountant.DEFAULT_RDP_ORDERS)


def check_orders(orders: Sequence[float] | None,
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
        if not is_real(order) or not math.isfinite(order) or order <= 1:
            raise ValueError(
                f"every RDP order must be a finite number > 1, got {order!r} in orders; "
                "order 1 gives no bound, use e.g. classic_orders(200).")
    return tuple(float(order) for order in orders)


# --------------------------------------------------------------------------------------
# RDP -> epsilon.
# --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class EpsilonReport:
    """An (epsilon, delta)-DP guarantee and how it was obtained.

    Attributes:
      epsilon: the epsilon of the guarantee, for one unit of privacy (the ledger's).
      order: the RDP order alpha at which the conversion attained ``epsilon``; None for
        ``Conversion.PLD``, which uses no RDP.
      delta: the delta of the guarantee.
      conversion: the conversion used.
    """

    epsilon: float
    order: float | None
    delta: float
    conversion: Conversion

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form; ``conversion`` is its string value."""
        return {"epsilon": self.epsilon, "order": self.order, "delta": self.delta,
                "conversion": self.conversion.value}

    def __str__(self) -> str:
        how = (f"{self.conversion.value} conversion, optimal order {self.order:g}"
               if self.order is not None else f"{self.conversion.value} accounting")
        return f"epsilon = {self.epsilon:.8f} at delta = {self.delta:g} ({how})"


def classic_epsilon(orders: np.ndarray, rdp: np.ndarray,
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


class _ExcludedOrderFilter(logging.Filter):
    """dp_accounting warns when its series for a fractional order does not converge and
    drops that order; a minimum over fewer orders can only be larger (conservative), so
    the warning, repeated for every evaluation, is noise to a user."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to converge" not in record.getMessage()


@contextlib.contextmanager
def _quiet_excluded_orders() -> Iterator[None]:
    logger = logging.getLogger("absl")
    excluded = _ExcludedOrderFilter()
    logger.addFilter(excluded)
    try:
        yield
    finally:
        logger.removeFilter(excluded)


# --------------------------------------------------------------------------------------
# The ledger.
# --------------------------------------------------------------------------------------

class RdpLedger(abc.ABC):
    """Run-length encoded Gaussian spends, composed in RDP (module docstring).

    Subclasses say what a spend is: which events they accept (:meth:`_runs_of`), the
    ``DpEvent`` of their runs (:meth:`_event`), the neighbouring relation it is proven
    under (:attr:`relation`) and how a run is stored in the state dict.

    Args:
      delta: the delta of every reported (epsilon, delta) guarantee, in (0, 1).
      conversion: the (epsilon, delta) conversion (a :class:`Conversion` or its value,
        "dp_accounting", "classic" or "pld").
      orders: RDP orders, each finite and > 1. None means :data:`CLASSIC_ORDERS` for
        the classic conversion and :data:`DP_ACCOUNTING_ORDERS` otherwise (the RDP curve
        is still available under "pld", from :meth:`rdp`).
    """

    #: The keys of the state dict and of one stored run, exactly.
    STATE_KEYS: ClassVar[frozenset[str]]
    SPEND_KEYS: ClassVar[frozenset[str]]

    def __init__(self, *, delta: float, conversion: Conversion | str = Conversion.DP_ACCOUNTING,
                 orders: Sequence[float] | None = None) -> None:
        self._delta = check_delta(delta)
        self._conversion = check_conversion(conversion)
        self._orders = check_orders(orders, self._conversion)
        self._runs: list[Run] = []

    # ------------------------------------------------------------------ what a spend is
    @property
    @abc.abstractmethod
    def relation(self) -> dp_accounting.NeighboringRelation:
        """The neighbouring relation the spends' guarantee is proven under."""

    @abc.abstractmethod
    def _runs_of(self, event: dp_accounting.DpEvent) -> list[Run]:
        """The validated runs ``(*key, count)`` of ``event``; raises on anything else."""

    @abc.abstractmethod
    def _event(self, runs: Sequence[Run]) -> dp_accounting.DpEvent:
        """The ``DpEvent`` of ``runs``."""

    @abc.abstractmethod
    def _spend_state(self, run: Run) -> dict[str, Any]:
        """One run as a JSON mapping with exactly :attr:`SPEND_KEYS`."""

    @classmethod
    @abc.abstractmethod
    def _run_from_state(cls, index: int, spend: Mapping[str, Any]) -> Run:
        """The run of a stored spend (keys already checked); validates its values."""

    @abc.abstractmethod
    def _pld_epsilon(self, runs: Sequence[Run]) -> float:
        """Epsilon at :attr:`delta` of ``runs`` under ``Conversion.PLD``."""

    def _extra_state(self) -> dict[str, Any]:
        """State beyond delta, conversion, orders and spends (e.g. the sampler)."""
        return {}

    @classmethod
    def _empty_from_state(cls, state: Mapping[str, Any]) -> RdpLedger:
        """An empty ledger with the state's settings (keys and version already checked)."""
        return cls(delta=state["delta"], conversion=state["conversion"],
                   orders=state["orders"])

    # ------------------------------------------------------------------ settings
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
        """The number of mechanisms spent (the sum of the runs' counts)."""
        return sum(run[-1] for run in self._runs)

    # ------------------------------------------------------------------ spending
    @staticmethod
    def _append(runs: list[Run], run: Run) -> None:
        """Appends ``run``, merged into the last one when their keys are the same."""
        count = run[-1]
        if count == 0:
            return
        if runs and runs[-1][:-1] == run[:-1]:
            runs[-1] = (*run[:-1], runs[-1][-1] + count)
        else:
            runs.append(tuple(run))

    def spend(self, event: dp_accounting.DpEvent) -> None:
        """Records ``event``; it is validated as a whole before anything is recorded."""
        for run in self._runs_of(event):
            self._append(self._runs, run)

    # ------------------------------------------------------------------ reporting
    def dp_event(self) -> dp_accounting.DpEvent:
        """Everything spent so far as one ``DpEvent`` (e.g. for another accountant)."""
        return self._event(self._runs)

    def _accountant(self, runs: Sequence[Run]) -> dp_accounting.rdp.RdpAccountant:
        accountant = dp_accounting.rdp.RdpAccountant(orders=list(self._orders),
                                                     neighboring_relation=self.relation)
        with _quiet_excluded_orders():
            accountant.compose(self._event(runs))
        return accountant

    def _report(self, runs: Sequence[Run]) -> EpsilonReport:
        if self._conversion is Conversion.PLD:
            return EpsilonReport(epsilon=self._pld_epsilon(runs), order=None,
                                 delta=self._delta, conversion=self._conversion)
        accountant = self._accountant(runs)
        if self._conversion is Conversion.DP_ACCOUNTING:
            epsilon, order = accountant.get_epsilon_and_optimal_order(self._delta)
        else:
            epsilon, order = classic_epsilon(accountant.orders, accountant.rdp, self._delta)
        return EpsilonReport(epsilon=float(epsilon), order=float(order), delta=self._delta,
                             conversion=self._conversion)

    def rdp(self) -> np.ndarray:
        """The RDP epsilon at each of :attr:`orders`, for one unit of privacy."""
        return self._accountant(self._runs).rdp

    def epsilon(self) -> EpsilonReport:
        """The (epsilon, delta) guarantee of everything spent so far."""
        return self._report(self._runs)

    def epsilon_after_event(self, event: dp_accounting.DpEvent) -> EpsilonReport:
        """What :meth:`epsilon` would report after ``spend(event)``, without spending."""
        runs = list(self._runs)
        for run in self._runs_of(event):
            self._append(runs, run)
        return self._report(runs)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot; :meth:`from_state_dict` restores it exactly."""
        return {"version": STATE_VERSION, "delta": self._delta,
                "conversion": self._conversion.value, "orders": list(self._orders),
                **self._extra_state(),
                "spends": [self._spend_state(run) for run in self._runs]}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> RdpLedger:
        """Rebuilds a ledger from :meth:`state_dict`; it reports the identical epsilon.

        Raises:
          ValueError / TypeError: if the state is malformed or has been tampered with
            (missing or unknown keys, unknown conversion or version, invalid delta or
            orders, a stored spend whose values are invalid, a count that is not a
            positive integer).
        """
        name = cls.__name__
        if not isinstance(state, Mapping):
            raise TypeError(f"{name} state must be a mapping from state_dict(), "
                            f"got {type(state).__name__}: {state!r}.")
        keys = set(state)
        if keys != cls.STATE_KEYS:
            raise ValueError(
                f"{name} state must have exactly the keys {sorted(cls.STATE_KEYS)}; "
                f"missing {sorted(cls.STATE_KEYS - keys)}, unknown "
                f"{sorted(map(str, keys - cls.STATE_KEYS))}. Restore it from an unmodified "
                f"state_dict().")
        if state["version"] != STATE_VERSION or isinstance(state["version"], bool):
            raise ValueError(f"{name} state version must be {STATE_VERSION}, got "
                             f"{state['version']!r}; it was written by an incompatible "
                             f"version of dclens.")
        if not isinstance(state["orders"], (list, tuple)):
            raise TypeError(f"{name} state 'orders' must be a list, got "
                            f"{state['orders']!r}.")
        ledger = cls._empty_from_state(state)
        spends = state["spends"]
        if not isinstance(spends, (list, tuple)):
            raise TypeError(f"{name} state 'spends' must be a list, got {spends!r}.")
        for i, spend in enumerate(spends):
            if not isinstance(spend, Mapping) or set(spend) != cls.SPEND_KEYS:
                raise ValueError(f"{name} state spends[{i}] must be a mapping with "
                                 f"exactly the keys {sorted(cls.SPEND_KEYS)}, got {spend!r}.")
            ledger._append(ledger._runs, cls._run_from_state(i, spend))
        return ledger


def check_count(index: int, count: Any) -> int:
    """A stored run's count: an integer >= 1 (the ledger never stores empty spends)."""
    return check_int(f"spends[{index}]['count']", count, minimum=1,
                     hint="the ledger never records empty or negative spends")
