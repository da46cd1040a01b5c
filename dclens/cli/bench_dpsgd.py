"""The private-classifier step's parts (dclens/dpsgd): seconds each, and NormTopK's fast
path against its literal version; JSON on stdout.

  python scripts/bench_dpsgd.py                    # B = 512, the default model, ~1 min
  python scripts/bench_dpsgd.py --batch 256 --repeats 5 --fraction 0.5

On random images and labels of Fashion-MNIST's shape with ``scripts/dpsgd.py``'s default
model (Opacus' MNIST CNN), median seconds over ``--repeats`` of: the [B, P] per-example
gradients by layer-wise outer products (``per_example.by_layer``, the default) and by
``tf.vectorized_map`` (the reference; their largest difference is printed), per-example
GEP's anchor subspace (``--anchors`` per-example gradients, then one power iteration per
group: TensorFlow float32 against the NumPy float64 reference, same span), clipping, and
NormTopK (TopAgg for DP-SGD, Alg. 4) by the fast path
(one value sort, the kept prefix's length and tie ranks; ``norm_topk``) and by the literal
argsort / cumsum / inverse permutation (``norm_topk_literal``). The two masks are checked
equal. The float32 matmul peak of this machine, measured in the same run, and the CPU's
name come with them, so ratios can be compared across machines.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from dclens.common import machine  # noqa: E402
from dclens.common import tf_env
from dclens.experiments import bench
from dclens.dpsgd import gep, mechanisms, models, per_example


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench_dpsgd.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1], allow_abbrev=False)
    parser.add_argument("--batch", type=int, default=512,
                        help="examples per step (dpsgd.py's expected batch) [default: 512]")
    parser.add_argument("--fraction", type=float, default=0.8,
                        help="NormTopK's k, a fraction in (0, 1) [default: 0.8]")
    parser.add_argument("--anchors", type=int, default=2000,
                        help="GEP anchor gradients for the basis timing [default: 2000]")
    parser.add_argument("--num_bases", type=int, default=500,
                        help="GEP bases over all groups [default: 500, dpsgd.py's]")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed repetitions of each part (median) [default: 3]")
    return parser



def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error(f"--batch must be an integer >= 1, got {args.batch}")
    if not 0 < args.fraction < 1:
        parser.error(f"--fraction must be in (0, 1) (1 keeps everything: nothing to "
                     f"compare), got {args.fraction}")
    if args.repeats < 1:
        parser.error(f"--repeats must be an integer >= 1, got {args.repeats}")
    import numpy as np
    import tensorflow as tf


    rng = np.random.default_rng(0)
    images = tf.constant(rng.uniform(0, 1, (args.batch, 28, 28, 1)).astype(np.float32))
    labels = tf.constant(rng.integers(0, 10, args.batch), tf.int64)
    model = models.sample_convnet(seed=0)

    def loss(y, logits):
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)

    fast_gradients = tf.function(lambda x, y: per_example.by_layer(model, loss, x, y))
    loop_gradients = tf.function(lambda x, y: per_example.vectorized(model, loss, x, y))
    gradients = fast_gradients(images, labels)
    reference = loop_gradients(images, labels)
    clipped = mechanisms.clip_rows(gradients, 1.0)
    anchor_images = tf.constant(rng.uniform(0, 1, (args.anchors, 28, 28, 1)).astype(np.float32))
    anchor_labels = tf.constant(rng.integers(0, 10, args.anchors), tf.int64)
    anchor_grads = fast_gradients(anchor_images, anchor_labels)
    anchor_grads_numpy = anchor_grads.numpy()
    groups = gep.group_sizes(int(anchor_grads.shape[1]), 3)

    def bases(build):
        return build(anchor_grads_numpy if build is gep.anchor_bases_reference
                     else anchor_grads, groups, args.num_bases, rng=np.random.default_rng(1))
    fast = mechanisms.norm_topk(clipped, args.fraction).numpy()
    literal = mechanisms.norm_topk_literal(clipped, args.fraction).numpy()
    seconds = {
        "per_example_by_layer": bench.median_seconds(
            lambda: fast_gradients(images, labels).numpy(), args.repeats),
        "per_example_vectorized_map": bench.median_seconds(
            lambda: loop_gradients(images, labels).numpy(), args.repeats),
        "gep_anchor_gradients": bench.median_seconds(
            lambda: fast_gradients(anchor_images, anchor_labels).numpy(), args.repeats),
        "gep_bases_tensorflow_float32": bench.median_seconds(
            lambda: bases(gep.anchor_bases), args.repeats),
        "gep_bases_numpy_float64": bench.median_seconds(
            lambda: bases(gep.anchor_bases_reference), args.repeats),
        "clip": bench.median_seconds(
            lambda: mechanisms.clip_rows(gradients, 1.0).numpy(), args.repeats),
        "norm_topk_fast": bench.median_seconds(
            lambda: mechanisms.norm_topk(clipped, args.fraction).numpy(), args.repeats),
        "norm_topk_literal": bench.median_seconds(
            lambda: mechanisms.norm_topk_literal(clipped, args.fraction).numpy(),
            args.repeats),
    }
    peak = bench.matmul_peak_gflops()
    print(json.dumps({
        "cpu": machine.cpu_model_name(), "batch": args.batch,
        "parameters": int(gradients.shape[1]), "fraction": args.fraction,
        "repeats": args.repeats, "seconds": seconds,
        "norm_topk_speedup": seconds["norm_topk_literal"] / seconds["norm_topk_fast"],
        "per_example_speedup": (seconds["per_example_vectorized_map"]
                                / seconds["per_example_by_layer"]),
        "gep_bases_speedup": (seconds["gep_bases_numpy_float64"]
                              / seconds["gep_bases_tensorflow_float32"]),
        # ||A A^T - B B^T||_F^2 = ||A - B B^T A||_F^2 + ||B - A A^T B||_F^2 (A, B orthonormal)
        "gep_bases_projection_distance": max(
            math.sqrt(float(np.sum((a - b @ (b.T @ a)) ** 2) + np.sum((b - a @ (a.T @ b)) ** 2)))
            for a, b in zip((x.astype(np.float64) for x in bases(gep.anchor_bases)),
                            bases(gep.anchor_bases_reference))),
        "per_example_max_abs_difference": float(tf.reduce_max(tf.abs(gradients - reference))),
        "norm_topk_masks_equal": bool(np.array_equal(fast, literal)),
        "kept_fraction_of_coordinates": float(np.mean(fast != 0)),
        "matmul_peak_gflops": peak}, indent=2))
    return 0


if __name__ == "__main__":
    tf_env.prepare_cli_environment()     # before TensorFlow is imported; see dclens/common/tf_env.py
    tf_env.import_tensorflow_quietly()
    sys.exit(main())
