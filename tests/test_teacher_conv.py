"""The teachers' convolution paths: equal to a literal per-teacher convolution, chosen
correctly, and a small job that works with oneDNN on and off (tests/cpu_job.py in
subprocesses, so a CI machine whose default differs cannot hide a regression)."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from dclens.datalens import teacher_conv, teacher_op
from dclens.datalens.config import ConvPath, TrainConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
AVAILABLE = [ConvPath.PER_TEACHER] + (
    [ConvPath.GROUPED] if teacher_conv.grouped_gradient_supported() else [])
#: float32 round-off of a sum of up to 25*11 products of values ~1 and ~0.1, relative to
#: the largest entry; a wrong tap, teacher or channel gives differences of order 1.
RTOL = 1e-5


def _literal(x, kernel):
    """One tf.nn.conv2d per teacher on its own channels: the definition."""
    t, c_in = kernel.shape[0], kernel.shape[3]
    return tf.concat([tf.nn.conv2d(x[..., i * c_in:(i + 1) * c_in], kernel[i], strides=2,
                                   padding="SAME") for i in range(t)], axis=3)


def _case(seed, t=3, c_in=2, c_out=4, size=14, batch=5):
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(batch, size, size, t * c_in)).astype(np.float32))
    kernel = tf.constant(rng.normal(0, 0.1, (t, 5, 5, c_in, c_out)).astype(np.float32))
    return x, kernel


def _relative(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


@pytest.mark.parametrize("path", AVAILABLE, ids=lambda p: p.value)
@pytest.mark.parametrize("size", [14, 7])        # even and odd inputs: 'SAME' pads differ
def test_path_equals_literal_convolution_and_its_gradients(path, size):
    x, kernel = _case(0, size=size)
    upstream = tf.constant(np.random.default_rng(1).normal(
        size=(5, -(-size // 2), -(-size // 2), 12)).astype(np.float32))

    def value_and_grads(fn):
        with tf.GradientTape() as tape:
            tape.watch([x, kernel])
            out = fn(x, kernel)
            loss = tf.reduce_sum(out * upstream)
        return [out, *tape.gradient(loss, [x, kernel])]

    fast = value_and_grads(tf.function(lambda a, k: teacher_conv.conv5x5_stride2(a, k, path)))
    reference = value_and_grads(_literal)
    for name, a, b in zip(("output", "input gradient", "kernel gradient"), fast, reference):
        assert _relative(a, b) < RTOL, (path, name)


@pytest.mark.parametrize("path", AVAILABLE, ids=lambda p: p.value)
def test_teacher_output_depends_on_its_own_kernel_only(path):
    """Changing teacher 1's kernel changes only teacher 1's output channels."""
    x, kernel = _case(2)
    before = teacher_conv.conv5x5_stride2(x, kernel, path).numpy()
    changed = tf.tensor_scatter_nd_add(kernel, [[1]], tf.ones((1, 5, 5, 2, 4)))
    after = teacher_conv.conv5x5_stride2(x, changed, path).numpy()
    moved = np.abs(after - before).reshape(*after.shape[:3], 3, 4).max(axis=(0, 1, 2, 4))
    assert moved[0] == 0 and moved[2] == 0 and moved[1] > 0.1


def test_auto_resolves_to_a_path_that_works():
    path = teacher_conv.resolve_conv_path("auto")
    assert path in AVAILABLE + [ConvPath.FUSED]
    assert teacher_conv.resolve_conv_path(ConvPath.PER_TEACHER) is ConvPath.PER_TEACHER


def test_auto_takes_the_fused_op_where_it_is_built():
    # scripts/setup.sh builds it on every machine: the suite runs where it was built.
    assert teacher_op.available(), teacher_op.library_path()
    assert teacher_conv.resolve_conv_path("auto") is ConvPath.FUSED


def test_unknown_path_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"'im2col'.*auto, grouped, per_teacher, fused"):
        teacher_conv.resolve_conv_path("im2col")


def test_grouped_path_refused_where_its_gradient_is_missing(monkeypatch):
    teacher_conv.grouped_gradient_supported.cache_clear()
    monkeypatch.setattr(teacher_conv, "grouped_gradient_supported", lambda: False)
    monkeypatch.setattr(teacher_op, "available", lambda: False)
    with pytest.raises(ValueError, match="TF_ENABLE_ONEDNN_OPTS=1"):
        teacher_conv.resolve_conv_path("grouped")
    assert teacher_conv.resolve_conv_path("auto") is ConvPath.PER_TEACHER


def test_fused_path_refused_by_name_where_the_op_is_not_built(monkeypatch, tmp_path):
    missing = tmp_path / "nowhere.so"
    monkeypatch.setenv(teacher_op.ENV_LIBRARY, str(missing))
    with pytest.raises(ValueError, match=r"conv path 'fused' needs the teacher-step op: .*"
                                         r"nowhere.so does not exist; build it with `make -C ops`"):
        teacher_conv.resolve_conv_path("fused")
    assert teacher_conv.resolve_conv_path("auto") is not ConvPath.FUSED


def test_config_refuses_a_conv_path_string():
    with pytest.raises(ValueError, match="conv_path must be one of"):
        TrainConfig(conv_path="per_teacher")


def test_machine_description_names_cpu_and_onednn():
    described = teacher_conv.describe(ConvPath.PER_TEACHER)
    assert described["conv_path"] == "per_teacher"
    assert described["fused_op_available"] is teacher_op.available()
    assert described["onednn_enabled"] in (True, False, None)
    if os.path.exists("/proc/cpuinfo"):
        assert "sse4_2" in described["cpu_vector_extensions"]


@pytest.mark.parametrize("onednn", ["0", "1"])
def test_small_job_in_a_fresh_process(onednn, tiny_fmnist_dir, tmp_path):
    """TF_ENABLE_ONEDNN_OPTS=0 and =1: every available path matches the reference and a
    tiny main.py training run finishes with its outputs, whatever this CPU's default.
    The user's TF_ENABLE_ONEDNN_OPTS wins over the CLI's default."""
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(TF_ENABLE_ONEDNN_OPTS=onednn, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "cpu_job.py"),
                           str(tiny_fmnist_dir), str(tmp_path / "run")],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if report["onednn_enabled"] is not None:
        assert report["onednn_enabled"] is (onednn == "1")
    if onednn == "1":
        assert report["grouped_gradient_supported"], "oneDNN on should differentiate groups"
    assert report["auto"] in report["differences"]
    for path, differences in report["differences"].items():
        for name, value in differences.items():
            assert value < 1e-4, (path, name, value)
    job = report["run"]
    assert job["exit_code"] == 0, job["stderr"]
    assert {"samples.npz", "privacy.json", "generator.keras"} <= set(job["outputs"])
    # The CLI keeps TF's C++ logs quiet (no cuInit error lines on a CPU-only machine) and
    # says which convolution path it took.
    for noise in ("cuInit", "I0000", "E0000", "absl::InitializeLog"):
        assert noise not in job["stderr"], job["stderr"]
    assert f"teacher convolutions: {report['auto']} path" in job["stdout"]
    assert f"oneDNN {'on' if onednn == '1' else 'off'}" in job["stdout"]


def _fresh_python(code: str, **env_changes: str | None) -> str:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_ENABLE_ONEDNN_OPTS", "TF_CPP_MIN_LOG_LEVEL")}
    env.update({k: v for k, v in env_changes.items() if v is not None}, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120, check=True)
    return done.stdout.strip()


PREPARE = ("import os; from dclens.common import tf_env; applied = tf_env.prepare_cli_environment(); "
           "print(sorted(applied), os.environ['TF_ENABLE_ONEDNN_OPTS'], "
           "os.environ['TF_CPP_MIN_LOG_LEVEL'])")


def test_cli_environment_defaults_only_what_the_user_left_unset():
    assert _fresh_python(PREPARE) == ("['TF_CPP_MIN_LOG_LEVEL', 'TF_ENABLE_ONEDNN_OPTS'] 1 3")
    assert _fresh_python(PREPARE, TF_ENABLE_ONEDNN_OPTS="0", TF_CPP_MIN_LOG_LEVEL="1") == \
        "[] 0 1"


def test_cli_environment_is_left_alone_once_tensorflow_is_imported(monkeypatch):
    from dclens.common import tf_env

    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    assert tf_env.prepare_cli_environment() == {}         # this process imported TF already
    assert "TF_ENABLE_ONEDNN_OPTS" not in os.environ
