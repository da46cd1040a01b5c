"""GEP (dclens/dpsgd/gep.py): anchor bases, exact reconstruction with noise off and a
full-rank basis, the two sensitivities under an adversarial one-example change, events."""

import math

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf

from dclens.dpsgd import gep


def test_groups_and_bases_follow_sqrt_p():
    assert gep.group_sizes(10, 3) == [4, 3, 3]
    assert gep.bases_per_group([100, 400], 30, anchors=1000) == [10, 20]
    assert gep.bases_per_group([4, 400], 300, anchors=50) == [4, 50]   # capped
    with pytest.raises(ValueError, match="num_groups"):
        gep.group_sizes(3, 4)


def test_anchor_bases_are_orthonormal_and_capture_the_anchor_span():
    rng = np.random.default_rng(0)
    span = rng.standard_normal((3, 40))                  # anchors live in a 3-dim space
    anchors = rng.standard_normal((20, 3)) @ span
    bases = gep.anchor_bases(anchors, [40], num_bases=3, rng=rng)
    basis = bases[0].astype(np.float64)
    np.testing.assert_allclose(basis.T @ basis, np.eye(3), atol=1e-5)
    projected = anchors @ basis @ basis.T
    np.testing.assert_allclose(projected, anchors, atol=1e-4 * np.abs(anchors).max())


def test_anchor_bases_span_what_a_float64_reference_spans():
    """The TensorFlow float32 power iteration against NumPy float64 (L drawn from the same
    generator state): the projections V V^T agree, group by group."""
    rng = np.random.default_rng(5)
    anchors = rng.standard_normal((200, 20)) @ rng.standard_normal((20, 300))
    anchors += 0.01 * rng.standard_normal((200, 300))       # a dominant 20-dim span
    sizes = gep.group_sizes(300, 2)
    got = gep.anchor_bases(anchors, sizes, num_bases=24, rng=np.random.default_rng(9))
    want = gep.anchor_bases_reference(anchors, sizes, num_bases=24,
                                      rng=np.random.default_rng(9))
    for basis, reference in zip(got, want):
        assert basis.shape == reference.shape and basis.dtype == np.float32
        np.testing.assert_allclose(basis.astype(np.float64) @ basis.T,
                                   reference @ reference.T, atol=2e-4)


def test_noise_off_full_rank_reconstructs_the_clipped_mean_gradient():
    rng = np.random.default_rng(1)
    grads = rng.standard_normal((6, 12)).astype(np.float32) * 0.1     # no clip binds
    bases = gep.anchor_bases(rng.standard_normal((30, 12)), gep.group_sizes(12, 2),
                             num_bases=12, rng=rng)
    assert [b.shape[1] for b in bases] == [6, 6]                       # full rank
    mechanism = gep.Gep(clip_embedding=10.0, clip_residual=10.0, sigma=0.0)
    zeros_k, zeros_p = tf.zeros(12), tf.zeros(12)
    got = mechanism.aggregate(grads, bases, expected_batch=4.0, noise_embedding=zeros_k,
                              noise_residual=zeros_p).numpy()
    np.testing.assert_allclose(got, grads.sum(0) / 4.0, rtol=1e-4, atol=1e-6)
    biased = gep.Gep(clip_embedding=10.0, clip_residual=10.0, sigma=0.0, residual=False)
    np.testing.assert_allclose(biased.aggregate(grads, bases, expected_batch=4.0,
                                                noise_embedding=zeros_k,
                                                noise_residual=zeros_p).numpy(),
                               got, rtol=1e-4, atol=1e-6)


def test_one_example_moves_each_release_by_at_most_its_clip():
    rng = np.random.default_rng(2)
    bases = gep.anchor_bases(rng.standard_normal((8, 30)), gep.group_sizes(30, 3),
                             num_bases=6, rng=rng)
    mechanism = gep.Gep(clip_embedding=1.5, clip_residual=0.5, sigma=1.0)
    worst = np.zeros(2)
    for trial in range(100):
        batch = rng.standard_normal((5, 30)).astype(np.float32) * 3
        extra = (rng.standard_normal((1, 30)) * 10.0 ** rng.uniform(-2, 4)).astype(np.float32)
        if trial % 4 == 3:                                   # a non-finite gradient
            extra[0, trial % 30] = (np.nan, np.inf, -np.inf)[trial % 3]
        w1, r1 = mechanism.split(np.vstack([batch, extra]), bases)
        w0, r0 = mechanism.split(batch, bases)
        worst = np.maximum(worst, [
            float(tf.norm(tf.reduce_sum(w1, 0) - tf.reduce_sum(w0, 0))),
            float(tf.norm(tf.reduce_sum(r1, 0) - tf.reduce_sum(r0, 0)))])
    assert np.all(np.isfinite(worst)), worst             # NaN would fail every bound
    assert worst[0] <= 1.5 * (1 + 1e-5) and worst[1] <= 0.5 * (1 + 1e-5)
    assert worst[0] > 1.4 and worst[1] > 0.45            # the clips are what binds


def test_events_shared_batch_two_gaussians_and_b_gep_one():
    q, sigma, steps, delta = 1 / 60, 2.0, 3000, 1e-5

    def epsilon(event):
        accountant = dp_accounting.rdp.RdpAccountant()
        accountant.compose(event)
        return accountant.get_epsilon(delta)

    two = epsilon(gep.Gep(sigma=sigma).event(q, steps))
    # Two Gaussians of multiplier sigma on one batch = one of multiplier sigma / sqrt(2).
    folded = epsilon(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        q, dp_accounting.GaussianDpEvent(sigma / math.sqrt(2))), steps))
    assert two == pytest.approx(folded, rel=1e-9)
    one = epsilon(gep.Gep(sigma=sigma, residual=False).event(q, steps))
    assert one < two
