"""Step-for-step parity of dclens with the authors' TF1 DataLens code.

:func:`run_side_by_side` builds the authors' ``DCGAN`` (their ``model.py``, loaded by
:mod:`dclens.parity.tf1_compat`) and a :class:`dclens.datalens.train.DataLens` on one small shared
configuration, gives both **the same everything**, runs their ``train_together`` for a
few generator steps and then dclens for as many, and compares them step by step.

What is shared, and how:

* **Data and partitions**: a class-balanced subset of the real Fashion-MNIST training set
  (``teachers * records`` images, the same number of each class, in data-set order), fed to
  their ``DCGAN`` in place of its file loader; their ``evenly_partition_dataset`` splits it
  (with equal class counts it never wraps, so the partitions are disjoint) and the same
  partitions, as record indices, go to dclens (``DataLens(partitions=...)``).
* **Initial weights**: dclens' initial teachers and generator are copied into their
  variables by name right after their ``global_variables_initializer`` (:data:`dclens.parity.authors_side.TEACHER_NAMES`,
  :data:`dclens.parity.authors_side.GENERATOR_NAMES`).
* **Random draws**: their code draws everything from numpy's global RNG, seeded from
  ``config.seed`` while it runs (:func:`dclens.parity.authors_side.seeded_global_numpy`:
  the same configuration gives the same report); while it runs,
  ``np.random.uniform`` (z), ``randint`` (query labels), ``rand`` (stochastic-sign uniforms,
  one per coordinate; made float32-exact) and ``normal`` (the DP noise: their
  ``np.random.normal(votes, sigma)`` returns votes + sigma * n with n standard normal,
  float32-exact, from the harness' own generator) are recorded, and dclens replays them
  through :class:`dclens.parity.our_side.ReplayDraws` (the documented :mod:`dclens.datalens.draws` hook; the per-coordinate
  uniforms are restricted to dclens' top-k with :func:`dclens.datalens.topagg.uniforms_in_topk_order`).
* **The fake batch of the teachers' step**: dclens runs with the authors' rendering
  (``fake_rendering=teacher_labels``).

Compared after every generator step (their values are read at the same points of their
loop: after the teachers' ``save_d``, in ``aggregate_results``, after the generator's
optimizer step): each teacher's discriminator loss on its batch after its updates (held on
the same, their, weights; the run's own loss reported), every
teacher weight, the image gradients, the vote sums (their value is the mean their
``np.random.normal`` receives), the noisy update (thresholded; or, with
``threshold=False``, their ``--signsgd_nothresh``: the noisy vote sum / k), every
generator weight and epsilon (their ``compute_eps_from_delta`` over their RDP counter vs
our ledger, classic conversion).  :data:`dclens.parity.compare.TOLERANCES` states the float32 tolerances; the report says for every
quantity whether it is within them.

The pieces: :mod:`dclens.parity.config` (the shared configuration and data subset),
:mod:`dclens.parity.authors_side` (their run, recorded), :mod:`dclens.parity.our_side`
(dclens replaying their draws) and :mod:`dclens.parity.compare` (one step's comparison).
"""


from __future__ import annotations

import dataclasses
import io
import os
import tempfile
import time
from typing import Any, Callable

import numpy as np

from dclens import data
from dclens.datalens.train import DataLens, TeacherPlacement
from dclens.parity import tf1_compat
from dclens.parity.authors_side import run_authors, their_partitions
from dclens.parity.compare import NORMALISED_AWAY, TOLERANCES, compare_step, format_row
from dclens.parity.config import SideBySideConfig, SideBySideError, balanced_subset
from dclens.parity.our_side import Observer, ReplayDraws, run_dclens


def run_side_by_side(config: SideBySideConfig, authors_repo: str | os.PathLike, *,
                     perturb: str | None = None, free_running: bool = False,
                     log: Callable[[str], None] = print) -> dict[str, Any]:
    """Runs both implementations on ``config``; returns the report (see module docstring).

    ``perturb``: ``"noise"`` or ``"weights"`` changes one input of dclens only (the DP
    noise of one coordinate, or one initial teacher weight) -- to show the harness flags a
    disagreement.  ``free_running``: dclens runs from its own state after the first step
    instead of the authors' (lockstep, the default): shows how the two trajectories
    separate through float32 round-off (not held to the tolerances).
    """
    started = time.perf_counter()
    repo = tf1_compat.check_repo(authors_repo)
    full = data.load_dataset("fashion_mnist", config.data_dir)
    subset = balanced_subset(full.labels, config.teachers * config.records)
    images, labels = full.images[subset], full.labels[subset]
    one_hot = np.eye(10, dtype=np.float32)[labels]
    dataset = data.LabeledImages(images, labels, full.spec, f"{full.source} (subset)")
    with tempfile.TemporaryDirectory(prefix="dclens-side-by-side-") as workdir, \
            tf1_compat.load_authors_code(repo) as code:
        partitions = their_partitions(code, labels, one_hot, config.teachers)
        lens_ref: list = []
        draws = ReplayDraws([])
        observer = Observer(lens_ref, draws.steps)
        lens = DataLens(config.dclens_config(), dataset, root_seed=config.seed,
                        placement=TeacherPlacement(ensemble="reference"),
                        partitions=partitions, draws=draws)
        lens.observer = observer
        lens_ref.append(lens)
        their_log = io.StringIO()
        log(f"side by side: {config.teachers} teachers x {config.records} records, "
            f"{config.steps} steps, k={config.topk}, sigma={config.sigma}, "
            f"beta={config.thresh}, stochastic={config.stochastic}, "
            f"threshold={config.threshold} ({config.method.value})")
        log("running the authors' train_together ...")
        theirs = run_authors(code, config, images, one_hot, lens, workdir, their_log)
        if len(theirs) < config.steps:
            raise SideBySideError(f"the authors' run recorded {len(theirs)} of "
                                  f"{config.steps} steps")
        draws.steps.extend(theirs)
        if perturb == "noise":
            draws.steps[0] = dataclasses.replace(theirs[0], noise=[
                n + (1000.0 if j == 0 else 0.0) for j, n in enumerate(theirs[0].noise)])
        elif perturb == "weights":
            weights = lens.bank.weights.copy()
            weights[0, 0] += 0.05
            lens.bank.assign("weights", weights)
        elif perturb is not None:
            raise SideBySideError(f"unknown perturbation {perturb!r}; use noise or weights")
        log("running dclens ...")
        ours = run_dclens(lens, observer, config.steps,
                          theirs=None if free_running else theirs)
    rows = [compare_step(i, o, t, config) for i, (o, t) in enumerate(zip(ours, theirs))]
    for row in rows:
        log(format_row(row))
    return {
        "config": dataclasses.asdict(config),
        "authors_repo": str(repo),
        "tolerances": TOLERANCES,
        "mode": "free_running" if free_running else "lockstep",
        "not_held_to_tolerance": list(NORMALISED_AWAY),
        "perturbation": perturb,
        "steps": rows,
        # Free-running trajectories separate by round-off: reported, not judged.
        "agree": None if free_running else all(row["agree"] for row in rows),
        "seconds": time.perf_counter() - started,
    }
