"""Which settings a resumed DataLens run may change, and which differences refuse it
(the rule :func:`dclens.runs.rundir.plan_run` applies to a DataLens run directory)."""

from __future__ import annotations

from typing import Any

from dclens.datalens.config import DataLensConfig
from dclens.runs.rundir import config_differences, flatten, unflatten

# Settings that may differ between the saved run and a resuming command.
CHANGEABLE_ON_RESUME = frozenset({"train.epochs", "train.teacher_chunk", "train.num_samples",
                                  "train.save_votes", "train.class_direction_every",
                                  "train.conv_path", "budget.max_eps"})
# Settings whose change would alter what the ledger means (named as such in refusals).
PRIVACY_RELEVANT = frozenset({
    "topagg.sigma", "topagg.topk", "topagg.thresh", "topagg.max_grad", "topagg.method",
    "topagg.klevel",
    "train.num_teachers", "train.dataset", "train.data_dir", "train.max_records",
    "train.training_records",
    "train.partition_seed", "train.balanced_partition", "train.batch_size", "train.g_step",
    "train.query_batch", "train.warm_start", "train.non_private", "train.seed", "budget.delta", "budget.conversion",
    "budget.max_order"})


def with_defaults_for_missing(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config with every setting it lacks filled in with today's default.

    A run directory written by an older dclens has no entry for a setting added since. Every
    setting is added with a default that reproduces what dclens did before it existed (the
    rule for new settings), so a missing entry means that default, and the run resumes as
    long as the new setting is left at it. A setting passed at a non-default value still
    differs and is refused by name.
    """
    defaults = flatten(DataLensConfig().to_dict())
    filled = dict(flatten(saved))
    for name, value in defaults.items():
        filled.setdefault(name, value)
    return unflatten(filled)


def resume_differences(saved: dict[str, Any], config: DataLensConfig
                       ) -> list[tuple[str, Any, Any]]:
    """The settings that keep a saved run from being continued (or evaluated) as ``config``:
    every difference except the performance-only settings of CHANGEABLE_ON_RESUME, with
    settings the saved run predates taken at their defaults."""
    return [d for d in config_differences(with_defaults_for_missing(saved), config.to_dict())
            if d[0] not in CHANGEABLE_ON_RESUME]
