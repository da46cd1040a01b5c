"""GS-WGAN's privacy accounting: the provable iteration-level event (default) and the
released code's per-sample composition (a named, marked option).

One DP iteration picks one of the N_D discriminators uniformly (independently each
iteration), i.e. samples 1 of N_D disjoint shards without replacement, and releases B
sanitized per-image gradients, each a Gaussian mechanism with noise multiplier sigma
(:mod:`dclens.gswgan.steps`).  Neighbouring datasets differ by **replacing one
example**, which replaces one shard (so one discriminator): ``REPLACE_ONE``.

* :attr:`Accounting.ITERATION` (default, provable): the B releases share the sampled
  discriminator, so together they are one Gaussian with multiplier sigma / sqrt(B), and
  the subsampling amplifies that whole mechanism once per iteration:
  ``SampledWithoutReplacementDpEvent(N_D, 1, GaussianDpEvent(sigma / sqrt(B)))`` per
  iteration (the ledger writes it as B Gaussians(sigma) composed on one sample, the same
  event).
* :attr:`Accounting.PER_SAMPLE_PAPER` (the released code's ``privacy_analysis.py``):
  ``SampledWithoutReplacementDpEvent(N_D, 1, GaussianDpEvent(sigma))`` composed T * B
  times, as if each of the B releases sampled its own discriminator.  That is not what
  the algorithm does, and amplification of B separately sampled mechanisms is much
  stronger than of one sampled composition, so this epsilon is **not proven** for the
  algorithm; it is offered only to compare with the paper's numbers, and every output
  names it.

Both accountings also need that the mechanism of iteration t depends on the data only
through the sampled shard k_t (given the released history).  That holds when every
discriminator's DP-phase critic steps are thrown away (:attr:`CriticUpdates.DISCARD`,
default): D_k then starts each iteration from its warm-start state, a function of shard
k and of randomness fixed before the DP phase.  The released code keeps them
(:attr:`CriticUpdates.KEEP`): D_k's state then depends on *when* k was drawn before, the
hidden sampling that amplification rests on, and the subsampling theorem's condition
fails; no epsilon of such a run is proven, whatever the accounting (:func:`is_proven`).
"""

from __future__ import annotations

import enum

import dp_accounting

from dclens.privacy import sampled_ledger
from dclens.privacy.accounting import Conversion
from dclens.privacy.sampled_ledger import Sampling


class Accounting(enum.Enum):
    """Which composition produced an epsilon (module docstring)."""

    ITERATION = "iteration"
    PER_SAMPLE_PAPER = "per_sample_paper"

    @property
    def proven(self) -> bool:
        return self is Accounting.ITERATION

    @property
    def description(self) -> str:
        if self is Accounting.ITERATION:
            return ("iteration-level: one subsampled mechanism per iteration (the B "
                    "releases share the sampled discriminator); provable")
        return ("per-sample (the GS-WGAN code's privacy_analysis.py): T*B subsampled "
                "Gaussians, as if each release sampled its own discriminator; NOT proven "
                "for the algorithm, for comparison with the paper only")

    def iteration_event(self, *, sigma: float, num_discriminators: int,
                        batch_size: int) -> dp_accounting.DpEvent:
        """The event one DP iteration spends under this accounting."""
        gaussian = dp_accounting.GaussianDpEvent(noise_multiplier=sigma)
        if self is Accounting.ITERATION:
            shared = dp_accounting.SelfComposedDpEvent(gaussian, batch_size)
            return dp_accounting.SampledWithoutReplacementDpEvent(num_discriminators, 1,
                                                                  shared)
        sampled = dp_accounting.SampledWithoutReplacementDpEvent(num_discriminators, 1,
                                                                 gaussian)
        return dp_accounting.SelfComposedDpEvent(sampled, batch_size)


class CriticUpdates(enum.Enum):
    """What becomes of a discriminator's DP-phase critic steps (module docstring).

    * ``DISCARD`` (default, provable): the steps train a copy of D_k loaded from the bank
      (weights, spectral-norm vectors and Adam state as the warm-start left them); the
      copy is dropped after the iteration's release, and the bank never changes after the
      warm-start.  Iteration t's mechanism is then a function of shard k_t, the released
      generator and fresh randomness only: an adaptive composition of subsampled
      mechanisms, which is what both accountings compose.
    * ``KEEP`` (the released code, main.py): D_k's updated state goes back to the bank.
      It then depends on the earlier iterations that drew k -- hidden draws whose
      posterior given the released outputs differs between neighbouring datasets -- so
      even the "k_t is not the changed shard" branch differs between them, and the
      amplification theorem does not apply.  NOT proven; for comparison with the paper.
    """

    DISCARD = "discard"
    KEEP = "keep"

    @property
    def proven(self) -> bool:
        return self is CriticUpdates.DISCARD

    @property
    def description(self) -> str:
        if self is CriticUpdates.DISCARD:
            return ("discard: each DP iteration trains a copy of the drawn discriminator "
                    "from its warm-start state and drops it (the bank is fixed after the "
                    "warm-start), so each iteration depends on its shard only")
        return ("keep (the GS-WGAN code): a drawn discriminator keeps its DP-phase updates, "
                "so its state depends on the hidden earlier draws; NOT proven under any "
                "accounting")


def is_proven(accounting: Accounting, critic_updates: CriticUpdates) -> bool:
    """Whether an epsilon from ``accounting`` is proven for a run with ``critic_updates``."""
    return accounting.proven and critic_updates.proven


def new_ledger(*, delta: float, conversion: Conversion | str) -> sampled_ledger.SampledGaussianLedger:
    """An empty ledger for GS-WGAN iterations (without-replacement sampling, REPLACE_ONE)."""
    return sampled_ledger.SampledGaussianLedger(delta=delta,
                                                sampling=Sampling.WITHOUT_REPLACEMENT,
                                                conversion=conversion)


def epsilon(*, accounting: Accounting, sigma: float, num_discriminators: int,
            batch_size: int, iterations: int, delta: float,
            conversion: Conversion | str = Conversion.DP_ACCOUNTING) -> float:
    """Epsilon after ``iterations`` DP iterations under ``accounting``."""
    ledger = new_ledger(delta=delta, conversion=conversion)
    ledger.spend(dp_accounting.SelfComposedDpEvent(
        accounting.iteration_event(sigma=sigma, num_discriminators=num_discriminators,
                                   batch_size=batch_size), iterations))
    return ledger.epsilon().epsilon


def calibrate_sigma(*, accounting: Accounting, target_epsilon: float,
                    num_discriminators: int, batch_size: int, iterations: int,
                    delta: float, conversion: Conversion | str = Conversion.DP_ACCOUNTING
                    ) -> float:
    """The smallest sigma (0.1% relative) whose ``iterations`` stay within the target."""
    common = dict(target_epsilon=target_epsilon, rate=1.0 / num_discriminators,
                  delta=delta, sampling=Sampling.WITHOUT_REPLACEMENT, conversion=conversion)
    if accounting is Accounting.ITERATION:
        return sampled_ledger.calibrate_noise_multiplier(steps=iterations,
                                                         releases=batch_size, **common)
    return sampled_ledger.calibrate_noise_multiplier(steps=iterations * batch_size,
                                                     releases=1, **common)
