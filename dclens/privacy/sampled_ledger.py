"""A ledger for subsampled Gaussian mechanisms: DP-SGD, its TopAgg variant, GEP.

The mechanism
-------------
One training step samples a batch from the n private examples and releases one or more
Gaussian mechanisms computed on that batch (DP-SGD: the noisy sum of clipped gradients;
GEP: the noisy embedding and the noisy residual).  Two samplers, each with the adjacency
its amplification theorem is proven for:

* ``poisson``: every example joins independently with probability q; neighbouring
  datasets differ by **adding or removing one example** (``ADD_OR_REMOVE_ONE``).
* ``without_replacement``: m of N units drawn uniformly without replacement; neighbouring
  datasets differ by **replacing one unit** (``REPLACE_ONE``), e.g. GS-WGAN's one
  discriminator of N_D per iteration.

Several Gaussian mechanisms on the same sample count as one
----------------------------------------------------------
If a step releases Gaussian mechanisms i = 1..r on the same sample, with L2 sensitivities
Delta_i and noise standard deviations z_i Delta_i, dividing release i by z_i Delta_i
(invertible post-processing) turns them into one Gaussian mechanism with unit noise and
L2 sensitivity sqrt(sum_i z_i^-2).  So the step is exactly the subsampled Gaussian
mechanism with the *joint* noise multiplier

    z = (sum_i z_i^-2)^(-1/2)          (two releases with the same z: z / sqrt(2)),

which is what ``dp_accounting`` computes for a ``ComposedDpEvent`` inside a sampled event
too.  The ledger stores run-length encoded (sampler, rate, z, count) and composes them
with ``dp_accounting.rdp.RdpAccountant`` under the sampler's adjacency; epsilon is the
guarantee for one example (one unit for ``without_replacement``) at ``delta``, with the
conversions of :mod:`dclens.privacy.accounting`.  ``queries`` counts steps.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
from typing import Any, Mapping, Sequence

import dp_accounting

from dclens.privacy import accounting
from dclens.privacy.accounting import Conversion, EpsilonReport

_STATE_VERSION = 1
_STATE_KEYS = frozenset({"version", "kind", "delta", "conversion", "orders", "sampling",
                         "spends"})
_SPEND_KEYS = frozenset({"rate", "noise_multiplier", "count"})
KIND = "sampled_gaussian"


class Sampling(enum.Enum):
    """How a step's sample is drawn, and the adjacency that sampler is accounted under."""

    POISSON = "poisson"
    WITHOUT_REPLACEMENT = "without_replacement"

    @property
    def relation(self) -> dp_accounting.NeighboringRelation:
        if self is Sampling.POISSON:
            return dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
        return dp_accounting.NeighboringRelation.REPLACE_ONE

    @property
    def adjacency(self) -> str:
        """The unit of privacy in words, for every output that reports an epsilon."""
        if self is Sampling.POISSON:
            return "add or remove one example"
        return "replace one unit (one shard of the sampled population)"


class _ExcludedOrderFilter(logging.Filter):
    """dp_accounting warns when its series for a fractional order does not converge and
    drops that order; a minimum over fewer orders can only be larger (conservative), so
    the warning, repeated for every evaluation, is noise to a user."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to converge" not in record.getMessage()


@contextlib.contextmanager
def _quiet_excluded_orders():
    logger = logging.getLogger("absl")
    flt = _ExcludedOrderFilter()
    logger.addFilter(flt)
    try:
        yield
    finally:
        logger.removeFilter(flt)


def joint_noise_multiplier(event: dp_accounting.DpEvent) -> float:
    """z of the single Gaussian equivalent to ``event``: a Gaussian, or Gaussians composed
    (Composed / SelfComposed) on the same sample: (sum z_i^-2)^(-1/2) (module doc)."""
    inverse_squares = _inverse_squares(event)
    if inverse_squares == 0:
        raise ValueError(f"{event!r} releases nothing (a composition of zero Gaussians)")
    return 1.0 / math.sqrt(inverse_squares)


def _inverse_squares(event: dp_accounting.DpEvent) -> float:
    if isinstance(event, dp_accounting.GaussianDpEvent):
        z = event.noise_multiplier
        if not (isinstance(z, (int, float)) and math.isfinite(z) and z > 0):
            raise ValueError(f"a Gaussian noise multiplier must be finite and > 0, got {z!r}")
        return 1.0 / z ** 2
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return event.count * _inverse_squares(event.event)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return math.fsum(_inverse_squares(e) for e in event.events)
    raise TypeError(f"inside a sampled event the ledger records Gaussian mechanisms "
                    f"(possibly Composed / SelfComposed), got {type(event).__name__}: "
                    f"{event!r}")


class SampledGaussianLedger:
    """Composes subsampled Gaussian steps (module docstring); serialisable, like
    :class:`dclens.privacy.accounting.PrivacyLedger`, and usable by :class:`dclens.runs.journal.
    PrivacyJournal` (``queries`` counts steps)."""

    def __init__(self, *, delta: float, sampling: Sampling | str = Sampling.POISSON,
                 conversion: Conversion | str = Conversion.DP_ACCOUNTING,
                 orders: Sequence[float] | None = None) -> None:
        self._delta = accounting._check_delta(delta)
        self._conversion = accounting._check_conversion(conversion)
        self._orders = accounting._check_orders(orders, self._conversion)
        try:
            self._sampling = Sampling(sampling)
        except ValueError as error:
            raise ValueError(f"sampling must be one of {[s.value for s in Sampling]}, got "
                             f"{sampling!r}") from error
        self._runs: list[tuple[float, float, int]] = []      # (rate, z, count)

    @property
    def delta(self) -> float:
        return self._delta

    @property
    def conversion(self) -> Conversion:
        return self._conversion

    @property
    def orders(self) -> tuple[float, ...]:
        return self._orders

    @property
    def sampling(self) -> Sampling:
        return self._sampling

    @property
    def queries(self) -> int:
        """Steps spent (each a subsampled mechanism)."""
        return sum(count for _, _, count in self._runs)

    # ------------------------------------------------------------------ spending
    def _step_runs(self, event: dp_accounting.DpEvent,
                   multiplier: int = 1) -> list[tuple[float, float, int]]:
        if isinstance(event, dp_accounting.SelfComposedDpEvent):
            count = accounting._check_int("SelfComposedDpEvent.count", event.count, minimum=0)
            return self._step_runs(event.event, multiplier * count)
        if isinstance(event, dp_accounting.ComposedDpEvent):
            return [run for e in event.events for run in self._step_runs(e, multiplier)]
        if isinstance(event, dp_accounting.PoissonSampledDpEvent):
            self._expect(Sampling.POISSON, event)
            rate = event.sampling_probability
        elif isinstance(event, dp_accounting.SampledWithoutReplacementDpEvent):
            self._expect(Sampling.WITHOUT_REPLACEMENT, event)
            if not 0 < event.sample_size <= event.source_dataset_size:
                raise ValueError(f"sample_size must be in [1, source_dataset_size], got "
                                 f"{event!r}")
            rate = event.sample_size / event.source_dataset_size
            if event.sample_size != 1:
                raise ValueError(f"the ledger stores the sampling rate; a without-replacement "
                                 f"sample of {event.sample_size} > 1 units is not supported "
                                 f"({event!r})")
        else:
            raise TypeError(f"SampledGaussianLedger records Poisson-sampled or "
                            f"sampled-without-replacement Gaussian events (possibly "
                            f"composed), got {type(event).__name__}: {event!r}")
        if not (isinstance(rate, (int, float)) and 0 < rate <= 1):
            raise ValueError(f"the sampling rate must be in (0, 1], got {rate!r} in {event!r}")
        return [(float(rate), joint_noise_multiplier(event.event), multiplier)]

    def _expect(self, sampling: Sampling, event) -> None:
        if sampling is not self._sampling:
            raise ValueError(f"this ledger accounts {self._sampling.value} sampling "
                             f"({self._sampling.adjacency}); got a {sampling.value} event "
                             f"{event!r}: use a ledger per sampler")

    @staticmethod
    def _append(runs, rate: float, z: float, count: int) -> None:
        if count == 0:
            return
        if runs and runs[-1][:2] == (rate, z):
            runs[-1] = (rate, z, runs[-1][2] + count)
        else:
            runs.append((rate, z, count))

    def spend(self, event: dp_accounting.DpEvent) -> None:
        """Records ``event`` (validated as a whole before anything is recorded)."""
        for rate, z, count in self._step_runs(event):
            self._append(self._runs, rate, z, count)

    # ------------------------------------------------------------------ reporting
    def _event(self, runs) -> dp_accounting.DpEvent:
        def step(rate, z):
            gaussian = dp_accounting.GaussianDpEvent(noise_multiplier=z)
            if self._sampling is Sampling.POISSON:
                return dp_accounting.PoissonSampledDpEvent(sampling_probability=rate,
                                                           event=gaussian)
            size = round(1 / rate)
            return dp_accounting.SampledWithoutReplacementDpEvent(
                source_dataset_size=size, sample_size=1, event=gaussian)
        return dp_accounting.ComposedDpEvent(events=[
            dp_accounting.SelfComposedDpEvent(event=step(rate, z), count=count)
            for rate, z, count in runs])

    def dp_event(self) -> dp_accounting.DpEvent:
        """Everything spent so far as one ``DpEvent``."""
        return self._event(self._runs)

    def _report(self, runs) -> EpsilonReport:
        account = dp_accounting.rdp.RdpAccountant(orders=list(self._orders),
                                                  neighboring_relation=self._sampling.relation)
        with _quiet_excluded_orders():
            account.compose(self._event(runs))
        if self._conversion is Conversion.DP_ACCOUNTING:
            epsilon, order = account.get_epsilon_and_optimal_order(self._delta)
        else:
            epsilon, order = accounting._classic_epsilon(account.orders, account.rdp,
                                                         self._delta)
        return EpsilonReport(epsilon=float(epsilon), order=float(order), delta=self._delta,
                             conversion=self._conversion)

    def epsilon(self) -> EpsilonReport:
        """The (epsilon, delta) guarantee of everything spent so far."""
        return self._report(self._runs)

    def epsilon_after_event(self, event: dp_accounting.DpEvent) -> EpsilonReport:
        """What :meth:`epsilon` would report after ``spend(event)``, without spending."""
        runs = list(self._runs)
        for rate, z, count in self._step_runs(event):
            self._append(runs, rate, z, count)
        return self._report(runs)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"version": _STATE_VERSION, "kind": KIND, "delta": self._delta,
                "conversion": self._conversion.value, "orders": list(self._orders),
                "sampling": self._sampling.value,
                "spends": [{"rate": rate, "noise_multiplier": z, "count": count}
                           for rate, z, count in self._runs]}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> SampledGaussianLedger:
        """Rebuilds the ledger exactly; refuses a malformed or tampered state by name."""
        if not isinstance(state, Mapping) or set(state) != _STATE_KEYS:
            raise ValueError(f"a SampledGaussianLedger state has exactly the keys "
                             f"{sorted(_STATE_KEYS)}, got "
                             f"{sorted(state) if isinstance(state, Mapping) else state!r}; "
                             f"restore it from an unmodified state_dict()")
        if state["version"] != _STATE_VERSION or state["kind"] != KIND:
            raise ValueError(f"state version {state['version']!r} / kind {state['kind']!r} is "
                             f"not a version-{_STATE_VERSION} {KIND} ledger")
        ledger = cls(delta=state["delta"], sampling=state["sampling"],
                     conversion=state["conversion"], orders=state["orders"])
        if not isinstance(state["spends"], (list, tuple)):
            raise TypeError(f"'spends' must be a list, got {state['spends']!r}")
        for i, spend in enumerate(state["spends"]):
            if not isinstance(spend, Mapping) or set(spend) != _SPEND_KEYS:
                raise ValueError(f"spends[{i}] must have exactly the keys "
                                 f"{sorted(_SPEND_KEYS)}, got {spend!r}")
            rate = spend["rate"]
            if not (isinstance(rate, (int, float)) and not isinstance(rate, bool)
                    and 0 < rate <= 1):
                raise ValueError(f"spends[{i}]['rate'] must be in (0, 1], got {rate!r}")
            z = accounting._check_noise_multiplier(spend["noise_multiplier"])
            count = accounting._check_int(f"spends[{i}]['count']", spend["count"], minimum=1,
                                          hint="the ledger never records empty spends")
            cls._append(ledger._runs, float(rate), z, count)
        return ledger

    def __repr__(self) -> str:
        return (f"SampledGaussianLedger(delta={self._delta!r}, sampling="
                f"{self._sampling.value!r}, conversion={self._conversion.value!r}, "
                f"steps={self.queries})")


def ledger_from_state_dict(state: Mapping[str, Any]):
    """The ledger a state dict describes: a :class:`SampledGaussianLedger` if its ``kind``
    says so, else a :class:`dclens.privacy.accounting.PrivacyLedger` (DataLens' TopAgg ledger)."""
    if isinstance(state, Mapping) and state.get("kind") == KIND:
        return SampledGaussianLedger.from_state_dict(state)
    return accounting.PrivacyLedger.from_state_dict(state)


def calibrate_noise_multiplier(*, target_epsilon: float, rate: float, steps: int,
                               delta: float, sampling: Sampling | str = Sampling.POISSON,
                               releases: int = 1,
                               conversion: Conversion | str = Conversion.DP_ACCOUNTING,
                               tolerance: float = 1e-3) -> float:
    """The smallest per-release noise multiplier sigma (to ``tolerance`` relative) whose
    ``steps`` steps at sampling ``rate``, each releasing ``releases`` Gaussians with
    multiplier sigma on the same sample (GEP: 2), stay within ``target_epsilon``.

    Epsilon decreases as sigma grows, so a bracket then bisection (on log sigma).
    """
    target_epsilon = accounting._check_positive("target_epsilon", target_epsilon)
    steps = accounting._check_int("steps", steps, minimum=1)
    releases = accounting._check_int("releases", releases, minimum=1)

    def epsilon(sigma: float) -> float:
        ledger = SampledGaussianLedger(delta=delta, sampling=sampling, conversion=conversion)
        gaussian = dp_accounting.GaussianDpEvent(noise_multiplier=sigma)
        inner = (gaussian if releases == 1
                 else dp_accounting.SelfComposedDpEvent(gaussian, releases))
        step = (dp_accounting.PoissonSampledDpEvent(rate, inner)
                if Sampling(sampling) is Sampling.POISSON else
                dp_accounting.SampledWithoutReplacementDpEvent(round(1 / rate), 1, inner))
        ledger.spend(dp_accounting.SelfComposedDpEvent(step, steps))
        return ledger.epsilon().epsilon

    low = high = 1.0
    if epsilon(high) > target_epsilon:
        while epsilon(high) > target_epsilon:
            low, high = high, high * 2
            if high > 1e6:
                raise ValueError(f"no noise multiplier up to 1e6 reaches epsilon "
                                 f"{target_epsilon} in {steps} steps at rate {rate}")
    else:
        while epsilon(low) <= target_epsilon:
            low, high = low / 2, low
            if low < 1e-4:
                return high
    while high / low > 1 + tolerance:
        middle = math.sqrt(low * high)
        if epsilon(middle) <= target_epsilon:
            high = middle
        else:
            low = middle
    return high
