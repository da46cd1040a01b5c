"""Tests of the TopAgg custom op (ops/, dclens/datalens/vote_op.py) against the pure-TF reference.

Every case runs on each backend -- the pure-TF reference, the custom op's CPU kernel and
its GPU kernel (skipped without a GPU and a CUDA build) -- and requires the *identical*
int32 vote sum: the TF reference on CPU (itself checked against a slow numpy loop in
test_topagg.py), and, where denormals play no part, an independent vectorised numpy
implementation.

The custom-CPU cases FAIL when the library was not built (scripts/setup.sh builds it with
``make -C ops``); they are skipped only when ``DCLENS_VOTE_OP_OPTIONAL=1`` says the op is
not expected.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from dclens.datalens import topagg, vote_op
from dclens.datalens.config import Aggregation, TopAggConfig

STOCH = Aggregation.TOPK_STOCHASTIC_SIGN
SIGN = Aggregation.TOPK_SIGN
METHODS = [STOCH, SIGN]
BACKENDS = ["reference", "custom-cpu", "custom-gpu"]
REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------
# Helpers.
# --------------------------------------------------------------------------------------

def _require_op() -> None:
    """Fails (or skips, with DCLENS_VOTE_OP_OPTIONAL=1) when the op cannot be loaded."""
    if vote_op.available():
        return
    try:
        vote_op.load()
    except vote_op.VoteOpUnavailable as exc:
        reason = str(exc)
    if os.environ.get("DCLENS_VOTE_OP_OPTIONAL") == "1":
        pytest.skip(f"custom op not built (DCLENS_VOTE_OP_OPTIONAL=1): {reason}")
    pytest.fail(f"the custom op library is not available: {reason}")


def _require(backend: str) -> None:
    if backend == "reference":
        return
    if backend == "custom-gpu" and not tf.config.list_physical_devices("GPU"):
        pytest.skip("no GPU")
    _require_op()
    if backend == "custom-gpu":
        if "GPU" not in vote_op.kernel_devices():
            pytest.skip(f"{vote_op.loaded_library()} has no GPU kernel (make -C ops cuda)")


@pytest.fixture(params=BACKENDS)
def backend(request):
    _require(request.param)
    return request.param


def _run(backend: str, g, u, *, topk: int, max_grad: float, method: Aggregation):
    """summed_votes on one backend, inputs placed on that backend's device."""
    device = "/GPU:0" if backend == "custom-gpu" else "/CPU:0"
    with tf.device(device):
        grads = tf.identity(tf.constant(g, tf.float32))
        uniforms = None if u is None else tf.identity(tf.constant(u, tf.float32))
        out = topagg.summed_votes(grads, uniforms, topk=topk, max_grad=max_grad,
                                  method=method,
                                  backend="reference" if backend == "reference" else "custom")
    assert out.dtype == tf.int32
    return out.numpy()


def _tf_reference(g, u, *, topk, max_grad, method) -> np.ndarray:
    return _run("reference", g, u, topk=topk, max_grad=max_grad, method=method)


def _numpy_votes(g, u, *, topk, max_grad, method) -> np.ndarray:
    """An independent vectorised implementation (float32 throughout; no denormals)."""
    g = np.asarray(g, np.float32)
    order = np.argsort(-np.abs(g), axis=-1, kind="stable")[..., :topk]
    c = np.float32(max_grad)
    clipped = np.clip(np.take_along_axis(g, order, axis=-1), -c, c)
    scale = np.abs(clipped).max(axis=-1, keepdims=True)
    safe = np.where(scale == 0, np.float32(1), scale)
    n = np.where(scale == 0, np.float32(0), clipped / safe).astype(np.float32)
    if method is STOCH:
        votes = np.where(u < (np.float32(1) + n) / np.float32(2), 1, -1)
    else:
        votes = np.where(n >= 0, 1, -1)
    teachers, images, dim = g.shape
    flat = (np.arange(images)[None, :, None] * dim + order).ravel()
    return np.bincount(flat, weights=votes.ravel(), minlength=images * dim).reshape(
        images, dim).astype(np.int32)


def _grads(kind: str, shape, rng) -> np.ndarray:
    if kind == "normal":          # Paper scale, c = 1e-5: some clipped, some not.
        g = rng.normal(scale=1e-5, size=shape)
    elif kind == "ties":          # Integers: many equal |g|, +-equal magnitudes.
        g = rng.integers(-3, 4, size=shape)
    elif kind == "plusminus":     # Only +-1 and 0: every |g| ties.
        g = rng.choice([-1.0, 0.0, 1.0], size=shape)
    elif kind == "zeros":         # Sparse, and every other image all-zero.
        g = rng.integers(-2, 3, size=shape) * (rng.uniform(size=shape) < 0.05)
        g[:, ::2, :] = 0.0
    elif kind == "all_zero":
        g = np.zeros(shape)
    elif kind == "beyond_clip":   # Almost everything beyond c.
        g = rng.normal(scale=10.0, size=shape)
    elif kind == "denormal":      # Denormals tie with 0 in TF's CPU kernels (FTZ/DAZ).
        pick = rng.uniform(size=shape)
        g = np.where(pick < 0.3, 1e-40 * rng.integers(-2, 3, size=shape),
                     np.where(pick < 0.6, 0.0, 1e-38 * rng.normal(size=shape)))
    else:
        raise AssertionError(kind)
    return np.asarray(g, np.float32)


CLIP = {"normal": 1e-5, "ties": 2.0, "plusminus": 1.0, "zeros": 1.5, "all_zero": 1e-5,
        "beyond_clip": 0.5, "denormal": 1e-37}


def _check(backend, g, u, *, topk, max_grad, method, numpy_too=True):
    got = _run(backend, g, u, topk=topk, max_grad=max_grad, method=method)
    want = _tf_reference(g, u, topk=topk, max_grad=max_grad, method=method)
    np.testing.assert_array_equal(got, want)
    if numpy_too:
        np.testing.assert_array_equal(
            got, _numpy_votes(g, u, topk=topk, max_grad=max_grad, method=method))
    return got


# --------------------------------------------------------------------------------------
# 1. Identical vote sums.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.value)
@pytest.mark.parametrize("kind", ["normal", "ties", "plusminus", "zeros", "all_zero",
                                  "beyond_clip", "denormal"])
def test_small_cases_and_edge_k(backend, kind, method):
    rng = np.random.default_rng(len(kind))
    for shape, topk in [((6, 4, 50), 13), ((5, 3, 10), 1), ((5, 3, 10), 10), ((3, 2, 1), 1),
                        ((7, 5, 33), 32)]:
        g = _grads(kind, shape, rng)
        u = rng.uniform(size=(*shape[:2], topk)).astype(np.float32)
        got = _check(backend, g, u, topk=topk, max_grad=CLIP[kind], method=method,
                     numpy_too=kind != "denormal")
        assert np.all(np.abs(got).sum(-1) <= shape[0] * topk)


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.value)
def test_random_shapes(backend, method):
    rng = np.random.default_rng(17)
    kinds = ["normal", "ties", "plusminus", "zeros", "beyond_clip"]
    for trial in range(12):
        t, b, d = int(rng.integers(1, 9)), int(rng.integers(1, 6)), int(rng.integers(1, 400))
        topk = int(rng.integers(1, d + 1))
        kind = kinds[trial % len(kinds)]
        g = _grads(kind, (t, b, d), rng)
        u = rng.uniform(size=(t, b, topk)).astype(np.float32)
        _check(backend, g, u, topk=topk, max_grad=CLIP[kind], method=method)


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.value)
@pytest.mark.parametrize("kind", ["normal", "ties"])
@pytest.mark.parametrize("shape,topk", [((240, 15, 784), 200), ((16, 15, 12288), 700)],
                         ids=["mnist", "celeba"])
def test_paper_shapes(backend, shape, topk, kind, method):
    # The paper's [teachers, images, dim] with fewer teachers (4000 / 6000 in the paper;
    # scripts/bench_topagg.py times those).
    rng = np.random.default_rng(shape[-1])
    g = _grads(kind, shape, rng)
    u = rng.uniform(size=(*shape[:2], topk)).astype(np.float32)
    _check(backend, g, u, topk=topk, max_grad=CLIP[kind], method=method)


def test_uniform_draws_are_used_in_top_k_order(backend):
    # g = [0.5, -3, 0, 0.5], k = 3, c = 1: top-k order idx 1 (-3 -> n=-1), idx 0 (n=0.5),
    # idx 3 (n=0.5).  u by rank [0.1, 0.8, 0.7]: -1, -1 (0.8 >= 0.75), +1 (0.7 < 0.75).
    g = np.array([[[0.5, -3.0, 0.0, 0.5]]], np.float32)
    u = np.array([[[0.1, 0.8, 0.7]]], np.float32)
    np.testing.assert_array_equal(
        _run(backend, g, u, topk=3, max_grad=1.0, method=STOCH), [[-1, -1, 0, 1]])
    np.testing.assert_array_equal(
        _run(backend, g, None, topk=3, max_grad=1.0, method=SIGN), [[1, -1, 0, 1]])


def test_uniforms_at_the_boundary(backend):
    # u exactly (1 + n) / 2 votes -1 (strict <); n = 0 -> 0.5.
    g = np.array([[[0.0, 0.0]], [[2.0, 1.0]]], np.float32)  # n: [0, 0]; [1, 0.5].
    u = np.array([[[0.5, np.nextafter(np.float32(0.5), np.float32(0))]],
                  [[np.float32(1.0) - np.float32(2**-24), 0.75]]], np.float32)
    # Teacher 0: idx 0 u=0.5 -> -1, idx 1 u<0.5 -> +1; teacher 1: idx 0 n=1 -> +1,
    # idx 1 u=0.75 -> -1.
    np.testing.assert_array_equal(
        _run(backend, g, u, topk=2, max_grad=10.0, method=STOCH), [[0, 0]])


# --------------------------------------------------------------------------------------
# 2. The op itself: validation, graph mode, no gradient.
# --------------------------------------------------------------------------------------

@pytest.fixture
def op():
    _require_op()
    return vote_op


@pytest.mark.parametrize("kwargs,match", [
    (dict(grads=np.zeros((3, 4), np.float32), uniforms=np.zeros((3, 4, 1), np.float32),
          topk=1), r"rank 3.*rank 2.*\[3,4\]"),
    (dict(grads=np.zeros((2, 3, 4), np.float32), uniforms=np.zeros((2, 3, 5), np.float32),
          topk=5), r"k=5 is larger than the gradient dimension 4"),
    (dict(grads=np.zeros((2, 3, 4), np.float32), uniforms=np.zeros((2, 3, 3), np.float32),
          topk=2), r"\[2,3,2\].*got \[2,3,3\]"),
    (dict(grads=np.zeros((2, 3, 4), np.float32), uniforms=np.zeros((3, 3, 2), np.float32),
          topk=2), r"\[2,3,2\].*got \[3,3,2\]"),
    (dict(grads=np.zeros((2, 3, 4), np.float32), uniforms=np.zeros((6,), np.float32),
          topk=2), r"\[2,3,2\].*got \[6\]"),
], ids=["grads-rank", "k>dim", "uniforms-k", "uniforms-teachers", "uniforms-rank"])
def test_validation_errors(op, kwargs, match):
    errors = (ValueError, tf.errors.InvalidArgumentError)
    with pytest.raises(errors, match=match):  # Eager: the kernel's check.
        op.topk_sign_vote(kwargs["grads"], kwargs["uniforms"], topk=kwargs["topk"],
                          max_grad=1.0)
    # Graph with unknown shapes: the kernel's check at run time.
    spec = [tf.TensorSpec(None, tf.float32)] * 2
    fn = tf.function(lambda g, u: op.topk_sign_vote(g, u, topk=kwargs["topk"], max_grad=1.0),
                     input_signature=spec)
    with pytest.raises(errors, match=match):
        fn(kwargs["grads"], kwargs["uniforms"])


def test_shape_function_errors_at_trace_time(op):
    fn = tf.function(lambda g, u: op.topk_sign_vote(g, u, topk=5, max_grad=1.0))
    with pytest.raises(ValueError, match=r"k=5 is larger than the gradient dimension 4"):
        fn.get_concrete_function(tf.TensorSpec((2, 3, 4)), tf.TensorSpec((2, 3, 5)))
    with pytest.raises(ValueError, match="rank"):
        fn.get_concrete_function(tf.TensorSpec((2, 8)), tf.TensorSpec((2, 3, 5)))
    ok = tf.function(lambda g, u: op.topk_sign_vote(g, u, topk=2, max_grad=1.0))
    out = ok.get_concrete_function(tf.TensorSpec((None, 3, 7)), tf.TensorSpec(None))
    assert out.output_shapes.as_list() == [3, 7]


def test_other_argument_errors(op):
    g = np.zeros((2, 3, 4), np.float32)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="max_grad"):
        op.topk_sign_vote(g, None, topk=2, max_grad=0.0, stochastic=False)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="k"):
        op.topk_sign_vote(g, None, topk=0, max_grad=1.0, stochastic=False)
    with pytest.raises(ValueError, match="uniform"):
        op.topk_sign_vote(g, None, topk=2, max_grad=1.0, stochastic=True)
    # Deterministic sign: uniforms may be omitted (empty) or of the full shape (ignored).
    a = op.topk_sign_vote(g, None, topk=2, max_grad=1.0, stochastic=False)
    b = op.topk_sign_vote(g, np.full((2, 3, 2), 0.3, np.float32), topk=2, max_grad=1.0,
                          stochastic=False)
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_empty_inputs(op):
    for t, b in [(0, 3), (2, 0), (0, 0)]:
        out = op.topk_sign_vote(np.zeros((t, b, 5), np.float32),
                                np.zeros((t, b, 2), np.float32), topk=2, max_grad=1.0)
        np.testing.assert_array_equal(out.numpy(), np.zeros((b, 5), np.int32))


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.value)
def test_inside_tf_function(op, method):
    rng = np.random.default_rng(3)
    g = rng.normal(size=(9, 4, 100)).astype(np.float32)
    u = rng.uniform(size=(9, 4, 20)).astype(np.float32)
    uu = u if method is STOCH else None
    want = _tf_reference(g, uu, topk=20, max_grad=0.5, method=method)

    @tf.function(jit_compile=False)
    def custom(grads, uniforms):
        return topagg.summed_votes(grads, uniforms if method is STOCH else None, topk=20,
                                   max_grad=0.5, method=method, backend="custom")

    np.testing.assert_array_equal(custom(tf.constant(g), tf.constant(u)).numpy(), want)
    # Dynamic teacher count, and TopAgg.vote_sum (the "auto" backend) inside a function.
    agg = topagg.TopAgg(TopAggConfig(topk=20, sigma=1.0, max_grad=0.5, method=method),
                        num_teachers=9)

    @tf.function(jit_compile=False, reduce_retracing=True)
    def vote(grads):
        return agg.vote_sum(grads, seed=tf.constant([1, 2]))

    seed_u = agg.uniforms(9, 4, tf.constant([1, 2])).numpy() if method is STOCH else None
    np.testing.assert_array_equal(
        vote(tf.constant(g)).numpy(),
        _tf_reference(g, seed_u, topk=20, max_grad=0.5, method=method))


def test_not_differentiable(op):
    g = tf.constant(np.random.default_rng(0).normal(size=(2, 2, 6)).astype(np.float32))
    with tf.GradientTape() as tape:
        tape.watch(g)
        votes = op.topk_sign_vote(g, None, topk=3, max_grad=1.0, stochastic=False)
        loss = tf.reduce_sum(tf.cast(votes, tf.float32) * g[0])
    grad = tape.gradient(loss, g)
    # Only the direct use of g[0] contributes; nothing flows through the op.
    np.testing.assert_array_equal(grad.numpy()[1], np.zeros((2, 6), np.float32))
    from tensorflow.python.framework import ops  # pylint: disable=import-outside-toplevel
    assert ops.gradient_registry.lookup(vote_op.OP_NAME) is None


# --------------------------------------------------------------------------------------
# 3. Loading: lazy, the env switch, a missing library.
# --------------------------------------------------------------------------------------

@pytest.fixture
def fresh_loader(monkeypatch):
    """A loader with no cached state; restored (and reloadable) afterwards."""
    monkeypatch.delenv(vote_op.ENV_BACKEND, raising=False)
    monkeypatch.delenv(vote_op.ENV_LIBRARY, raising=False)
    vote_op.reset()
    yield monkeypatch
    monkeypatch.delenv(vote_op.ENV_LIBRARY, raising=False)
    vote_op.reset()


def test_importing_dclens_does_not_load_the_library():
    code = ("import dclens, dclens.datalens.topagg, dclens.datalens.vote_op as v\n"
            "from dclens.datalens.config import TopAggConfig\n"
            "dclens.datalens.topagg.TopAgg(TopAggConfig(), num_teachers=3)\n"
            "assert v.loaded_library() is None\n"
            "assert '_dclens_ops' not in open('/proc/self/maps').read()\n"
            "print('ok')\n")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_env_switch_forces_the_reference(fresh_loader, monkeypatch):
    monkeypatch.setenv(vote_op.ENV_BACKEND, "reference")

    def no_op(*args, **kwargs):
        raise AssertionError("the custom op was used")

    monkeypatch.setattr(vote_op, "topk_sign_vote", no_op)
    rng = np.random.default_rng(1)
    g = rng.normal(size=(3, 2, 30)).astype(np.float32)
    u = rng.uniform(size=(3, 2, 5)).astype(np.float32)
    got = topagg.summed_votes(tf.constant(g), tf.constant(u), topk=5, max_grad=1.0,
                              method=STOCH)
    np.testing.assert_array_equal(got.numpy(),
                                  _numpy_votes(g, u, topk=5, max_grad=1.0, method=STOCH))
    assert vote_op.resolve("auto") is vote_op.Backend.REFERENCE
    assert vote_op.loaded_library() is None  # Not even loaded.
    # An explicit backend is not overridden by the switch.
    assert vote_op.resolve("reference") is vote_op.Backend.REFERENCE
    for value in ["", "auto", "AUTO", "custom", "reference"]:
        monkeypatch.setenv(vote_op.ENV_BACKEND, value)
        assert vote_op.env_backend().value == (value.lower() or "auto")
    monkeypatch.setenv(vote_op.ENV_BACKEND, "fast")
    with pytest.raises(ValueError, match="DCLENS_VOTE_OP='fast'"):
        vote_op.resolve("auto")
    with pytest.raises(ValueError, match="backend must be one of"):
        vote_op.resolve("gpu")


def test_auto_uses_the_op_when_built(fresh_loader, monkeypatch):
    _require_op()
    calls = []
    real = vote_op.topk_sign_vote

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(vote_op, "topk_sign_vote", spy)
    agg = topagg.TopAgg(TopAggConfig(topk=4, sigma=1.0), num_teachers=2)
    agg.vote_sum(tf.zeros((2, 3, 10)), seed=tf.constant([0, 1]))
    assert len(calls) == 1 and calls[0]["stochastic"] is True
    assert vote_op.resolve("auto") is vote_op.Backend.CUSTOM


@pytest.mark.parametrize("bad", ["missing", "not_a_library"])
def test_missing_library_warns_once_and_falls_back(fresh_loader, monkeypatch, tmp_path, bad):
    path = tmp_path / "_dclens_ops.so"
    if bad == "not_a_library":
        path.write_text("this is not a shared library\n")
    monkeypatch.setenv(vote_op.ENV_LIBRARY, str(path))
    rng = np.random.default_rng(2)
    g = rng.normal(size=(4, 3, 25)).astype(np.float32)
    u = rng.uniform(size=(4, 3, 6)).astype(np.float32)
    want = _numpy_votes(g, u, topk=6, max_grad=1.0, method=STOCH)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            got = topagg.summed_votes(tf.constant(g), tf.constant(u), topk=6, max_grad=1.0,
                                      method=STOCH)
            np.testing.assert_array_equal(got.numpy(), want)
        assert not vote_op.available()
    ours = [w for w in caught if "custom op" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert "make -C ops" in str(ours[0].message) and str(path) in str(ours[0].message)
    assert issubclass(ours[0].category, RuntimeWarning)
    with pytest.raises(vote_op.VoteOpUnavailable, match="make -C ops"):
        topagg.summed_votes(tf.constant(g), tf.constant(u), topk=6, max_grad=1.0,
                            method=STOCH, backend="custom")
    monkeypatch.setenv(vote_op.ENV_BACKEND, "custom")
    with pytest.raises(vote_op.VoteOpUnavailable):
        topagg.summed_votes(tf.constant(g), tf.constant(u), topk=6, max_grad=1.0,
                            method=STOCH)
