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
conversions of :mod:`dclens.privacy.accounting`, or, for Poisson sampling only, with the
privacy loss distribution (``pld``: dp_accounting's PLD accountant, no RDP).  ``queries``
counts steps.
"""

from __future__ import annotations

import enum
import math
from typing import Any, Mapping, Sequence

import dp_accounting

from dclens.privacy import accounting, exact
from dclens.privacy.rdp_ledger import (Conversion, RdpLedger, Run, check_count,
                                       check_int, check_noise_multiplier, check_positive)

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


class SampledGaussianLedger(RdpLedger):
    """Composes subsampled Gaussian steps (module docstring); serialisable, like
    :class:`dclens.privacy.accounting.PrivacyLedger` (both share
    :class:`dclens.privacy.rdp_ledger.RdpLedger`), and usable by
    :class:`dclens.runs.journal.PrivacyJournal` (``queries`` counts steps).

    Runs are ``(rate, z, count)``: ``count`` steps, each sampling at ``rate`` and releasing
    the Gaussian mechanism(s) of joint noise multiplier ``z``.

    Args:
      delta, conversion, orders: as for :class:`dclens.privacy.rdp_ledger.RdpLedger`.
      sampling: the sampler every step uses, hence the adjacency (:class:`Sampling`).
    """

    STATE_KEYS = frozenset({"version", "kind", "delta", "conversion", "orders", "sampling",
                            "spends"})
    SPEND_KEYS = frozenset({"rate", "noise_multiplier", "count"})

    def __init__(self, *, delta: float, sampling: Sampling | str = Sampling.POISSON,
                 conversion: Conversion | str = Conversion.DP_ACCOUNTING,
                 orders: Sequence[float] | None = None) -> None:
        super().__init__(delta=delta, conversion=conversion, orders=orders)
        try:
            self._sampling = Sampling(sampling)
        except ValueError as error:
            raise ValueError(f"sampling must be one of {[s.value for s in Sampling]}, got "
                             f"{sampling!r}") from error
        if (self._conversion is Conversion.PLD
                and self._sampling is Sampling.WITHOUT_REPLACEMENT):
            raise ValueError(
                f"conversion 'pld' is not available for {self._sampling.value} sampling "
                f"({self._sampling.adjacency}, e.g. GS-WGAN): dp_accounting has no privacy "
                f"loss distribution for it, and dclens does not claim one it cannot prove. "
                f"Use conversion 'dp_accounting' (RDP, proven for this sampler).")

    @property
    def sampling(self) -> Sampling:
        return self._sampling

    @property
    def relation(self) -> dp_accounting.NeighboringRelation:
        return self._sampling.relation

    # ------------------------------------------------------------------ spending
    def _runs_of(self, event: dp_accounting.DpEvent, multiplier: int = 1) -> list[Run]:
        if isinstance(event, dp_accounting.SelfComposedDpEvent):
            count = check_int("SelfComposedDpEvent.count", event.count, minimum=0)
            return self._runs_of(event.event, multiplier * count)
        if isinstance(event, dp_accounting.ComposedDpEvent):
            return [run for e in event.events for run in self._runs_of(e, multiplier)]
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

    # ------------------------------------------------------------------ events and state
    def _event(self, runs: Sequence[Run]) -> dp_accounting.DpEvent:
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

    def _pld_epsilon(self, runs: Sequence[Run]) -> float:
        # Poisson sampling only (the constructor refuses the other sampler): the PLD of
        # the subsampled Gaussian under add-or-remove, composed by dp_accounting.
        return exact.pld_epsilon(self._event(runs), delta=self._delta,
                                 relation=self.relation)

    def _extra_state(self) -> dict[str, Any]:
        return {"kind": KIND, "sampling": self._sampling.value}

    def _spend_state(self, run: Run) -> dict[str, Any]:
        rate, z, count = run
        return {"rate": rate, "noise_multiplier": z, "count": count}

    @classmethod
    def _empty_from_state(cls, state: Mapping[str, Any]) -> SampledGaussianLedger:
        if state["kind"] != KIND:
            raise ValueError(f"SampledGaussianLedger state kind must be {KIND!r}, got "
                             f"{state['kind']!r}")
        return cls(delta=state["delta"], sampling=state["sampling"],
                   conversion=state["conversion"], orders=state["orders"])

    @classmethod
    def _run_from_state(cls, index: int, spend: Mapping[str, Any]) -> Run:
        rate = spend["rate"]
        if not (isinstance(rate, (int, float)) and not isinstance(rate, bool)
                and 0 < rate <= 1):
            raise ValueError(f"spends[{index}]['rate'] must be in (0, 1], got {rate!r}")
        return (float(rate), check_noise_multiplier(spend["noise_multiplier"]),
                check_count(index, spend["count"]))

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
    target_epsilon = check_positive("target_epsilon", target_epsilon)
    steps = check_int("steps", steps, minimum=1)
    releases = check_int("releases", releases, minimum=1)

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
