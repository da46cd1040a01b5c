"""A DataLens run's budget and its privacy record: how many generator steps the budget
allows before any is taken, and what ``privacy.json`` says the run spent.

A generator step is ``g_step`` rounds of Q TopAgg queries (Q = ``train.query_batch``, the
batch B by default); each query is the Gaussian mechanism on the thresholded votes with
sensitivity 2 sqrt(k) (or the mechanism's own, e.g. FetchSGD's), noise multiplier sigma / sensitivity (:mod:`dclens.datalens.topagg`).  Epsilon
is at ``budget.delta`` under the run's RDP -> (eps, delta) conversion
(:mod:`dclens.privacy.accounting`).
"""

from __future__ import annotations

import math

from dclens.datalens import topagg as topagg_lib
from dclens.datalens import warm_start
from dclens.datalens.config import DataLensConfig
from dclens.privacy import accounting
from dclens.runs.journal import PrivacyJournal

NOT_PRIVATE_WARNING = ("*** --non_private: NO differential privacy. This run's generator and "
                       "samples are NOT private; use them for debugging only. ***")
REPRODUCIBLE_NOISE_WARNING = (
    "--seed fixes the DP noise: anyone who knows the seed can reproduce and subtract it. "
    "Use seeded runs for tests and debugging; do not publish their outputs as private.")


UNPROVEN_ACCOUNTING_WARNING = (
    "FetchSGD with the authors' accounting (--sketch_accounting authors_unproven): its "
    "epsilon charges 2 sqrt(k) for noise added after unsketching and top-k, which no proof "
    "supports; the reported epsilon is NOT a guarantee (privacy.json says "
    "accounting_proven: false)")


DATA_DEPENDENT_PARTITION_WARNING = (
    "class-balanced partitions (--shuffle / balanced_partition, the authors'): a record's "
    "teacher depends on every record's label, so replacing one record can move many "
    "records between teachers and the 2 sqrt(k) sensitivity does not hold; the reported "
    "epsilon is NOT a guarantee (privacy.json says accounting_proven: false). The default "
    "partition (--noshuffle) is data-independent.")


def privacy_record(lens, config: DataLensConfig, curve: list[dict], stop_reason: str | None,
                   seeded: bool, journal: PrivacyJournal | None = None) -> dict:
    """The JSON ledger of a run (see module docstring)."""
    record = {
        "private": not config.train.non_private,
        "reproducible_noise": seeded,
        "delta": config.budget.delta,
        "max_eps": config.budget.max_eps,
        "conversion": config.budget.conversion.value,
        "sigma": config.topagg.sigma,
        "topk": config.topagg.topk,
        "aggregation": config.topagg.method.value,
        "accounting_proven": config.accounting_proven,
        "partition": ("class_balanced (data-dependent: not covered by the sensitivity)"
                      if config.train.balanced_partition else
                      "index (a random permutation of record indices: data-independent)"),
        "unit": "replacing one training record (it changes one teacher's partition)",
        # The mechanism's cached values (FetchSGD's come from its count sketch's hashes).
        "sensitivity": lens.topagg.sensitivity,
        "noise_multiplier": (lens.topagg.noise_multiplier
                             if config.topagg.sigma > 0 else None),
        "num_teachers": config.train.num_teachers,
        "queries_per_round": lens.query_batch,
        "queries": lens.ledger.queries,
        "steps": lens.step,
        "epsilon_per_step": curve,
        "stop_reason": stop_reason,
        "ledger": lens.ledger.state_dict(),
        "lost_queries": journal.lost_queries if journal is not None else 0,
        "lost_spends": journal.lost if journal is not None else [],
        "hyperparameter_selection": accounting.HYPERPARAMETER_SELECTION,
    }
    warm = getattr(lens, "warm_start", None)
    if warm is not None:
        record["warm_start"] = {
            "run": warm.path,
            "spends": [{"noise_multiplier": z, "count": count} for z, count in warm.spends],
            "what": "the generator started from the DP-MERF run's fit; its release of the "
                    "same records is composed in this ledger (journal round -1)"}
    if config.train.non_private:
        record["warning"] = NOT_PRIVATE_WARNING
    elif lens.ledger.queries:
        record["epsilon"] = lens.ledger.epsilon().to_dict()
        record["epsilon_all_conversions"] = {
            conversion.value: other_conversion(lens.ledger, conversion).epsilon().to_dict()
            for conversion in accounting.Conversion}
    return record


def other_conversion(ledger: accounting.PrivacyLedger,
                     conversion: accounting.Conversion) -> accounting.PrivacyLedger:
    """The same spends, converted with ``conversion`` (default orders of that conversion)."""
    state = dict(ledger.state_dict())
    if conversion is not ledger.conversion:
        state["conversion"] = conversion.value
        state["orders"] = list(accounting.CLASSIC_ORDERS if conversion is
                               accounting.Conversion.CLASSIC else accounting.DP_ACCOUNTING_ORDERS)
    return accounting.PrivacyLedger.from_state_dict(state)


class BudgetTooSmall(ValueError):
    """The budget allows no generator step at all; nothing was written."""


def _budget_arguments(config: DataLensConfig, batch: int, dim: int) -> dict:
    """The accountant's arguments for one generator step (g_step rounds of ``batch``
    queries, the run's query batch Q): the mechanism's noise multiplier expressed as
    TopAgg's sigma / (2 sqrt(k))."""
    topagg_sensitivity = 2.0 * math.sqrt(config.topagg.topk)
    multiplier = topagg_lib.noise_multiplier(config.topagg, dim)
    equivalent_sigma = (config.topagg.sigma
                        if topagg_lib.sensitivity(config.topagg, dim) == topagg_sensitivity
                        else multiplier * topagg_sensitivity)
    orders = (accounting.classic_orders(config.budget.max_order)
              if config.budget.conversion is accounting.Conversion.CLASSIC else None)
    prior = (() if config.train.warm_start is None else
             warm_start.open_warm_start(config.train.warm_start, config.train).events())
    return dict(sigma=equivalent_sigma, topk=config.topagg.topk,
                queries_per_step=batch * config.train.g_step, delta=config.budget.delta,
                conversion=config.budget.conversion, orders=orders, prior=prior)


def steps_within_budget(config: DataLensConfig, batch: int, dim: int) -> int:
    """Whole generator steps (g_step rounds of ``batch`` queries) the budget allows from
    nothing spent but a warm start's release (the epoch cap aside)."""
    return accounting.max_steps_within(max_eps=config.budget.max_eps,
                                       **_budget_arguments(config, batch, dim))


def check_budget_allows_a_step(config: DataLensConfig, batch: int, dim: int) -> None:
    """Refuses (:class:`BudgetTooSmall`, naming what one step costs) a private run whose
    budget allows no step: it would write an untrained generator's noise as its samples."""
    if batch < 1 or config.topagg.topk > dim:
        return          # not a budget question: DataLens refuses these by name
    if config.train.non_private or steps_within_budget(config, batch, dim) > 0:
        return
    one = accounting.epsilon_for(steps=1, **_budget_arguments(config, batch, dim)).epsilon
    raise BudgetTooSmall(
        f"the budget epsilon <= {config.budget.max_eps:g} allows 0 generator steps: one step "
        f"({config.train.g_step} round(s) of {batch} TopAgg queries) costs epsilon = "
        f"{one:.4g} at delta {config.budget.delta:g} ({config.budget.conversion.value} "
        f"conversion); raise --max_eps to at least {one:.4g}, or raise --sigma. Nothing "
        "was written.")


def expected_steps(config: DataLensConfig, lens, total_steps: int) -> int:
    """Steps the run will take: the budget's, or the epoch cap where it comes first."""
    if config.train.non_private:
        return total_steps
    return min(total_steps, steps_within_budget(config, lens.query_batch, lens.shape.dim))
