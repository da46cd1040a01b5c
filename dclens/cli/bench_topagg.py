"""Times TopAgg's vote step (summed_votes): the pure-TF reference vs the custom op.

Prints one JSON object.  For each [teachers, images, dim] case (by default the paper's
MNIST 4000 x 15 x 784, k = 200, and CelebA 6000 x 15 x 12288, k = 700, stochastic sign):
the median over --repeats timed passes (after one untimed warm-up pass) of the reference
and of the op, their ratio, and whether the two vote sums are identical.

Teachers are fed in chunks of --chunk teachers (the vote sum is additive): 6000 x 15 x
12288 float32 gradients are 4.4 GB, more than this is worth holding at once.  Each chunk's
gradients (N(0, 1e-5^2), the paper's scale) and uniforms are generated from a stateless
seed before it is timed (generation is not timed), and the reference and the op are timed
on the same chunk one after the other, so a change of machine load hits both.

Usage: python scripts/bench_topagg.py [--repeats 3] [--chunk 500] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

from dclens.common import tf_env

if __name__ == "__main__":
    tf_env.prepare_cli_environment()     # before TensorFlow is imported; see dclens/common/tf_env.py
    tf_env.import_tensorflow_quietly()

import tensorflow as tf  # noqa: E402

from dclens.datalens import topagg, vote_op  # noqa: E402
from dclens.datalens.config import Aggregation  # noqa: E402

PAPER_CASES = [((4000, 15, 784), 200), ((6000, 15, 12288), 700)]
QUICK_CASES = [((400, 15, 784), 200), ((60, 15, 12288), 700)]


def _chunk(index: int, teachers: int, images: int, dim: int, topk: int):
    grads = tf.random.stateless_normal((teachers, images, dim), seed=[index, 17],
                                       stddev=1e-5, dtype=tf.float32)
    uniforms = tf.random.stateless_uniform((teachers, images, topk), seed=[index, 18],
                                           dtype=tf.float32)
    return grads, uniforms


def _timed(grads, uniforms, topk, method, backend):
    start = time.perf_counter()
    votes = topagg.summed_votes(grads, uniforms, topk=topk, max_grad=1e-5, method=method,
                                backend=backend).numpy()
    return time.perf_counter() - start, votes


def bench_case(shape, topk, *, method, repeats, chunk):
    teachers, images, dim = shape
    chunk = min(chunk, teachers)
    bounds = [(a, min(a + chunk, teachers)) for a in range(0, teachers, chunk)]
    cache = {} if len(bounds) == 1 else None  # One chunk: generate it once.
    uniforms_needed = method is Aggregation.TOPK_STOCHASTIC_SIGN

    def data(i):
        if cache is not None and i in cache:
            return cache[i]
        a, z = bounds[i]
        grads, uniforms = _chunk(i, z - a, images, dim, topk)
        out = (grads, uniforms if uniforms_needed else None)
        if cache is not None:
            cache[i] = out
        return out

    # Warm-up (tracing, library loading): one chunk, both backends.
    grads, uniforms = data(0)
    for backend in ("reference", "custom"):
        _timed(grads, uniforms, topk, method, backend)
    del grads, uniforms

    ref_times, op_times, identical = [], [], True
    for _ in range(repeats):
        ref_total = op_total = 0.0
        for i in range(len(bounds)):
            grads, uniforms = data(i)
            t_ref, v_ref = _timed(grads, uniforms, topk, method, "reference")
            t_op, v_op = _timed(grads, uniforms, topk, method, "custom")
            identical = identical and bool((v_ref == v_op).all())
            ref_total += t_ref
            op_total += t_op
            del grads, uniforms
        ref_times.append(ref_total)
        op_times.append(op_total)
    ref, op = statistics.median(ref_times), statistics.median(op_times)
    return {
        "shape": list(shape), "topk": topk, "method": method.value,
        "teachers_per_chunk": chunk, "chunks": len(bounds),
        "input_gb": round(teachers * images * dim * 4 / 1e9, 3),
        "repeats": repeats,
        "reference_s": round(ref, 4), "op_s": round(op, 4),
        "speedup": round(ref / op, 2) if op > 0 else math.inf,
        "reference_all_s": [round(t, 4) for t in ref_times],
        "op_all_s": [round(t, 4) for t in op_times],
        "identical": identical,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=500,
                        help="teachers per chunk (default 500; 4.4 GB inputs in 0.37 GB "
                             "pieces for the CelebA shape)")
    parser.add_argument("--deterministic", action="store_true",
                        help="time the deterministic sign instead of the stochastic one")
    parser.add_argument("--quick", action="store_true", help="10x fewer teachers")
    return parser


def main() -> int:
    args = build_parser().parse_args()
    try:
        vote_op.load()
    except vote_op.VoteOpUnavailable as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    load_start = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    method = Aggregation.TOPK_SIGN if args.deterministic else Aggregation.TOPK_STOCHASTIC_SIGN
    cases = []
    for shape, topk in QUICK_CASES if args.quick else PAPER_CASES:
        # The MNIST shape (188 MB) is never chunked.
        chunk = shape[0] if shape[2] <= 784 else args.chunk
        cases.append(bench_case(shape, topk, method=method, repeats=args.repeats,
                                chunk=chunk))
    result = {
        "what": "seconds for summed_votes over all teachers (vote step: top-k, clip, "
                "normalise, sign, sum); median of repeats after a warm-up",
        "library": str(vote_op.loaded_library()),
        "threads": {
            "cpu_count": os.cpu_count(),
            "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else None,
            "tf_intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
            "tf_inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
            "note": "0 = TF default (all cores); the op shards over TF's intra-op pool",
        },
        "machine": platform.processor() or platform.machine(),
        "gpus": len(tf.config.list_physical_devices("GPU")),
        "load_average_start_end": [load_start,
                                   list(os.getloadavg()) if hasattr(os, "getloadavg")
                                   else None],
        "tensorflow": tf.__version__,
        "cases": cases,
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
