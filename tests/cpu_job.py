"""A small job run by tests/test_teacher_conv.py in a fresh process (oneDNN on or off).

Prints one JSON object: TF's oneDNN state, whether grouped-convolution gradients work, the
path ``auto`` picks, the largest fast-vs-reference difference of every available
convolution path (the fused teacher-step op included when it is built) (logits, Adam moments after two teacher steps, image gradients), and the
exit status and outputs of a tiny ``scripts/main.py --train`` run (a child process) on the data folder
given as argv[1], written to argv[2].
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import tensorflow as tf

from dclens.common import machine
from dclens.datalens import networks, teacher_conv, teacher_op, teachers
from dclens.datalens.config import ConvPath
from dclens.datalens.fast_ensemble import FastTeacherEnsemble

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _max_relative(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12))


def compare(path: ConvPath) -> dict[str, float]:
    """Fast ensemble on ``path`` against the plain reference, 3 teachers of 28x28x1."""
    shape = networks.ImageShape(28, 28, 1, 10)
    layout = teachers.ParamLayout.for_shape(shape)
    rng = np.random.default_rng(0)
    weights = teachers.initial_teacher_weights(layout, 3, rng)
    weights += rng.normal(0, 0.05, weights.shape).astype(np.float32)
    state = teachers.TeacherState(tf.constant(weights), tf.zeros_like(weights),
                                  tf.zeros_like(weights), tf.zeros([3], tf.int64))
    images = tf.constant(rng.uniform(size=(3, 6, 28, 28, 1)).astype(np.float32))
    fakes = tf.constant(rng.uniform(size=(3, 6, 28, 28, 1)).astype(np.float32))
    labels = tf.one_hot(rng.integers(0, 10, size=(3, 6)), 10)
    reference = teachers.TeacherEnsemble(shape, learning_rate=1e-3, beta1=0.5)
    fast = FastTeacherEnsemble(shape, learning_rate=1e-3, beta1=0.5, conv_path=path)
    out = {"logits": _max_relative(fast.logits(weights, images, labels),
                                   reference.logits(weights, images, labels))}
    new_fast, _ = fast.train(state, images, labels, fakes, labels, num_steps=2)
    new_reference, _ = reference.train(state, images, labels, fakes, labels, num_steps=2)
    # Adam's first moments (a running mean of the loss gradients), not the weights: where
    # a gradient is exactly 0 (a bias before batch norm) Adam's normalised step is decided
    # by round-off, so weight updates can differ by a full step there (test_fast_paths.py).
    out["adam_first_moment"] = _max_relative(new_fast.adam_m, new_reference.adam_m)
    out["adam_second_moment"] = _max_relative(new_fast.adam_v, new_reference.adam_v)
    out["image_gradients"] = _max_relative(
        fast.image_gradients(weights, images[0], labels[0]),
        reference.image_gradients(weights, images[0], labels[0]))
    return out


def tiny_run(data_dir: str, out: str) -> dict[str, object]:
    """``scripts/main.py --train`` on a tiny config, as a user runs it (a child process
    with this process's environment: TF_ENABLE_ONEDNN_OPTS as the test set it)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "main.py"), "--dataset", "fashion_mnist",
         "--data_dir", data_dir, "--train", "--batch_teachers", "2", "--teachers_batch", "2",
         "--batch_size", "10", "--topk", "50", "--sigma", "20", "--thresh", "0.25",
         "--max_eps", "1000", "--epoch", "1", "--d_step", "1", "--pretrain_teacher", "1",
         "--z_dim", "8", "--num_samples", "20", "--seed", "1", "--max_records", "80",
         "--checkpoint_dir", out, "--quiet"],
        capture_output=True, text=True, env=env, timeout=600, check=False)
    return {"exit_code": done.returncode, "stdout": done.stdout[-3000:],
            "stderr": done.stderr[-3000:],
            "outputs": sorted(os.listdir(out)) if os.path.isdir(out) else []}


def main() -> None:
    paths = [ConvPath.PER_TEACHER]
    if teacher_conv.grouped_gradient_supported():
        paths.append(ConvPath.GROUPED)
    if teacher_op.available():
        paths.append(ConvPath.FUSED)
    report = {"onednn_enabled": machine.onednn_enabled(),
              "fused_op_available": teacher_op.available(),
              "grouped_gradient_supported": teacher_conv.grouped_gradient_supported(),
              "auto": teacher_conv.resolve_conv_path(ConvPath.AUTO).value,
              "differences": {path.value: compare(path) for path in paths},
              "run": tiny_run(sys.argv[1], sys.argv[2])}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
