"""Comparing one generator step of dclens with the authors' code: differences, the
float32 tolerances they are held to (:data:`TOLERANCES`) and the explanation of vote
differences by near ties."""

from __future__ import annotations

from typing import Any

import numpy as np

from dclens.parity.authors_side import TEACHER_NAMES, TheirStep
from dclens.parity.config import SideBySideConfig, SideBySideError
from dclens.parity.our_side import OurStep


#: Biases followed by batch normalisation: their gradient is exactly zero in real
#: arithmetic (the normalisation removes any constant), so float32 round-off alone moves
#: them through Adam's normalised step, differently in each implementation.  They have no
#: effect on any output; they are reported but not held to a tolerance.
NORMALISED_AWAY = ("conv1/bias", "dense2/bias", "g_h0_lin/bias", "g_h1_lin/bias",
                   "g_h2_deconv/bias")


#: Float32 tolerances (each step starts both sides from the authors' state, so a step's
#: differences are that step's round-off):
#: * ``teacher_loss``, ``image_gradients``: max |ours - theirs| / max |theirs|, both
#:   computed on the same (their trained) teacher weights -- the run's own losses and
#:   image gradients inherit the training's round-off and are reported beside them, not
#:   held: in the pretrain step Adam starts from a zero state and moves a coordinate
#:   whose gradient is round-off by a full learning rate either way, and a few such
#:   coordinates can carry one teacher's loss 2e-4 (relative) apart (40 seeds of the
#:   tests' 2-teacher configuration, stochastic sign without threshold: median 1.7e-7,
#:   one seed 2.0e-4 with its weights within the movement tolerances below);
#: * votes from the same gradients and uniforms, and the noisy update from the same vote
#:   sums and noise, must be equal -- except the update without threshold (the authors'
#:   ``--signsgd_nothresh``: the noisy vote sum / k, real-valued), which dclens computes in
#:   float32 and theirs in float64: held to ``noisy_update_unthresholded``, relative to the
#:   largest |update| of the step (float32's unit round-off is 6e-8, and the sum, the
#:   product sigma x noise and the division by k round once each);
#: * weights, in units of Adam's reach in the step (learning_rate x Adam steps, about the
#:   farthest Adam moves a weight): Adam's first steps from a zero state are close to sign
#:   steps, so the few coordinates whose gradient is mostly round-off (near-cancelling
#:   sums) may step the other way in the two implementations: about 2 learning rates
#:   per Adam step, i.e. 2 reaches (not a strict bound: from a zero state with beta1 0.5
#:   and beta2 0.999, Adam's t-th step can reach 1.054 learning rates at t = 2 and 1.13
#:   at t = 3, for gradients that grow in that worst-case way).  Held: at most
#:   ``adam_outlier_fraction`` of the weights differ by more than ``adam_outlier`` reach, and none by more than
#:   ``adam_max`` reaches (a wrong learning rate, moment or normalisation moves almost
#:   every weight; measured over 17 runs of the tests' 2-teacher config: 0.007 to 0.98
#:   reach in the pretrain step, with up to 0.3% of the weights beyond 0.01 reach, and 0
#:   in the ordinary steps);
#: * votes and the noisy update must be equal except where the teachers' top-k sets
#:   differ within the two implementations' measured gradient difference (a near tie at
#:   the k-th largest |g|; :func:`explain_vote_differences`);
#: * ``epsilon``: relative.
TOLERANCES = {
    "teacher_loss": 1e-4,
    "image_gradients": 1e-4,
    "adam_outlier": 0.01,
    "adam_outlier_fraction": 0.02,
    "adam_max": 2.0,
    "epsilon": 1e-9,
    "noisy_update_unthresholded": 1e-6,
}


def update_mismatch(ours: np.ndarray, theirs: np.ndarray, threshold: bool) -> np.ndarray:
    """Where two released updates differ: any difference for the thresholded {-1, 0, 1}
    update; for the noisy sum / k (no threshold), a difference beyond
    ``noisy_update_unthresholded`` x max |theirs| (float32 against float64 round-off)."""
    if threshold:
        return ours != theirs
    scale = float(np.max(np.abs(theirs))) if theirs.size else 0.0
    return (np.abs(np.asarray(ours, np.float64) - theirs)
            > TOLERANCES["noisy_update_unthresholded"] * scale)


def difference(ours: np.ndarray, theirs: np.ndarray) -> dict[str, float]:
    """max |ours - theirs| and that over max |theirs| (0 when both are all zero)."""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    if ours.shape != theirs.shape:
        raise SideBySideError(f"shapes differ: ours {ours.shape}, theirs {theirs.shape}")
    absolute = float(np.max(np.abs(ours - theirs))) if ours.size else 0.0
    scale = float(np.max(np.abs(theirs))) if theirs.size else 0.0
    return {"max_abs": absolute, "max_rel": absolute / scale if scale > 0 else absolute}


def explain_vote_differences(our_grads: np.ndarray, their_grads: np.ndarray,
                             our_votes: np.ndarray, their_votes: np.ndarray,
                             topk: int) -> dict[str, int]:
    """Which vote-sum differences a near tie at the top-k boundary explains.

    For each (teacher, image) whose top-k coordinate sets differ (ours: ``tf.math.top_k``
    order; theirs: ``np.argpartition``), the swap is *explained* when every coordinate in
    the symmetric difference has |g| within twice that pair's measured gradient
    difference of the authors' k-th largest |g|.  A vote-sum difference at coordinate c
    of image j is explained when c is an explained swap of some teacher for image j.

    Args: gradients [T, B, D]; vote sums [B, D].
    """
    swapped_pairs = 0
    explained = np.zeros(our_votes.shape, bool)
    for t in range(our_grads.shape[0]):
        for j in range(our_grads.shape[1]):
            a, b = our_grads[t, j], their_grads[t, j]
            magnitude = np.abs(b)
            set_a = set(np.argsort(-np.abs(a), kind="stable")[:topk].tolist())
            set_b = set(np.argpartition(magnitude, -topk)[-topk:].tolist())
            if set_a == set_b:
                continue
            swapped_pairs += 1
            swapped = np.array(sorted(set_a ^ set_b))
            kth = np.sort(magnitude)[-topk]
            tolerance = 2.0 * float(np.max(np.abs(a - b)))
            near = np.abs(magnitude[swapped] - kth) <= tolerance
            explained[j, swapped[near]] = True
    mismatch = our_votes != their_votes
    return {"pairs_with_different_topk": swapped_pairs,
            "vote_sum_mismatches": int(mismatch.sum()),
            "vote_sum_mismatches_unexplained": int((mismatch & ~explained).sum())}


def compare_step(index: int, ours: OurStep, theirs: TheirStep,
                 config: SideBySideConfig) -> dict[str, Any]:
    """One step's differences and whether each is within :data:`TOLERANCES`."""
    epoch = index // config.steps_per_epoch
    adam_steps = (config.pretrain_teacher if epoch == 0 and config.pretrain_teacher > 0
                  else config.d_step)
    teacher = {name: difference(ours.teacher_weights[name], theirs.teacher_weights[name])
               for name in TEACHER_NAMES}
    generator = {name: difference(ours.generator_weights[name],
                                  theirs.generator_weights[name])
                 for name in ours.generator_weights}
    their_grads = np.stack(theirs.image_gradients, axis=1).reshape(ours.image_gradients.shape)
    their_votes = np.rint(np.stack(theirs.vote_sums)).astype(np.int64).reshape(
        ours.vote_sum.shape)
    # Their update is learning_rate x the thresholded sign (rounded back to {-1, 0, 1}),
    # or, without threshold, learning_rate x the noisy vote sum / k.
    their_update = (np.stack(theirs.updates) / config.learning_rate).reshape(
        ours.noisy_update.shape)
    if config.threshold:
        their_update = np.rint(their_update)
    votes = explain_vote_differences(ours.image_gradients, their_grads, ours.vote_sum,
                                     their_votes, config.topk)
    mismatch = update_mismatch(ours.noisy_update, their_update, config.threshold)
    vote_mismatch = ours.vote_sum != their_votes
    epsilon_rel = abs(ours.epsilon - theirs.epsilon) / theirs.epsilon

    def movement(ours_w: dict[str, np.ndarray], theirs_w: dict[str, np.ndarray],
                 steps: int) -> dict[str, float]:
        """Largest difference, and the fraction beyond adam_outlier, in Adam reaches."""
        reach = config.learning_rate * steps
        gaps = np.concatenate([np.abs(np.asarray(ours_w[n], np.float64) - theirs_w[n]).ravel()
                               for n in ours_w if n not in NORMALISED_AWAY]) / reach
        return {"max": float(gaps.max()),
                "outlier_fraction": float(np.mean(gaps > TOLERANCES["adam_outlier"]))}

    def within(moved: dict[str, float]) -> bool:
        return (moved["max"] <= TOLERANCES["adam_max"]
                and moved["outlier_fraction"] <= TOLERANCES["adam_outlier_fraction"])

    same_input = {
        "teacher_loss": difference(ours.teacher_loss_their_weights, theirs.teacher_loss),
        "image_gradients": difference(ours.image_gradients_their_weights, their_grads),
        "vote_sum_mismatches": int(np.sum(ours.vote_sum_their_gradients != their_votes)),
        "noisy_update_mismatches": int(np.sum(update_mismatch(
            ours.noisy_update_their_votes, their_update, config.threshold))),
        "noisy_update": difference(ours.noisy_update_their_votes, their_update),
    }
    row = {
        "step": index,
        "epoch": epoch,
        "same_inputs": same_input,
        "teacher_adam_steps": adam_steps,
        "teacher_loss": difference(ours.teacher_loss, theirs.teacher_loss),
        "teacher_weights": teacher,
        "teacher_movement": movement(ours.teacher_weights, theirs.teacher_weights,
                                     adam_steps),
        "image_gradients": difference(ours.image_gradients, their_grads),
        "votes": votes,
        "vote_sum_abs_total": int(np.abs(their_votes).sum()),
        "noisy_update_mismatches": int(mismatch.sum()),
        "noisy_update_difference": difference(ours.noisy_update, their_update),
        # The fraction of non-zero update coordinates (all, without threshold).
        "noisy_update_passed": (float(np.mean(np.abs(ours.noisy_update))) if config.threshold
                                else float(np.mean(ours.noisy_update != 0))),
        "generator_weights": generator,
        "generator_movement": movement(ours.generator_weights, theirs.generator_weights, 1),
        "epsilon": {"ours": ours.epsilon, "theirs": theirs.epsilon, "rel": epsilon_rel},
    }
    same_update = not mismatch.any()
    row["checks"] = {
        "teacher_loss": (same_input["teacher_loss"]["max_rel"]
                         <= TOLERANCES["teacher_loss"]),
        "teacher_weights": within(row["teacher_movement"]),
        "image_gradients": (same_input["image_gradients"]["max_rel"]
                            <= TOLERANCES["image_gradients"]),
        "votes_same_gradients": same_input["vote_sum_mismatches"] == 0,
        "noisy_update_same_votes": same_input["noisy_update_mismatches"] == 0,
        "votes": votes["vote_sum_mismatches_unexplained"] == 0,
        # The same noise on the same sums: an update may differ only where the sums do.
        "noisy_update": not (mismatch & ~vote_mismatch).any(),
        # With different updates the generators legitimately differ; compared otherwise.
        "generator_weights": within(row["generator_movement"]) if same_update else True,
        "epsilon": epsilon_rel <= TOLERANCES["epsilon"],
    }
    row["generator_compared"] = same_update
    row["agree"] = all(row["checks"].values())
    return row


def format_row(row: dict[str, Any]) -> str:
    """One line per step: the largest differences and the verdict."""
    failed = [name for name, ok in row["checks"].items() if not ok]
    votes = row["votes"]
    return (f"step {row['step']} (epoch {row['epoch']}):"
            f" loss {row['same_inputs']['teacher_loss']['max_rel']:.1e}"
            f" (run: {row['teacher_loss']['max_rel']:.1e})"
            f"  teachers {row['teacher_movement']['max']:.1e} reach"
            f" ({row['teacher_movement']['outlier_fraction']:.0e} beyond 0.01)"
            f"  image grads {row['same_inputs']['image_gradients']['max_rel']:.1e}"
            f" (run: {row['image_gradients']['max_rel']:.1e})"
            f"  votes differ {votes['vote_sum_mismatches']}"
            f" ({votes['vote_sum_mismatches_unexplained']} unexplained)"
            f"  update differs {row['noisy_update_mismatches']}"
            f"  generator {row['generator_movement']['max']:.1e} reach"
            f"{'' if row['generator_compared'] else ' (not compared)'}"
            f"  eps {row['epsilon']['ours']:.6f}/{row['epsilon']['theirs']:.6f}  "
            + ("AGREE" if row["agree"] else f"DISAGREE ({', '.join(failed)})"))
