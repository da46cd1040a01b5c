"""Seconds per DataLens generator step by phase, for named configurations; prints JSON.

  python scripts/bench.py --config fmnist-200 --steps 3 --warmup 1
  python scripts/bench.py --config fmnist-eps1-4000 --teachers 200     # extrapolated
  python scripts/bench.py --config fmnist-eps1-4000 --bank disk        # full size
  python scripts/bench.py --config fmnist-eps1-4000 --teachers 200 --aggregation \
      topk_stochastic_sign --aggregation klevel --aggregation fetchsgd  # Table 6

Configurations (dclens/experiments/bench.py SPECS): fmnist-eps1-4000 (paper), fmnist-200,
celeba-gender-64x64 (60 teachers), celeba-gender-4000, celeba-gender-6000 (paper).  With
--teachers N < the configuration's count, N teachers are run and the per-teacher phases
are extrapolated linearly (labelled "extrapolated" in the output).  Data are synthetic
(random images of the right shape).  A float32 matmul peak is measured in the same run
(before and after the benchmarks; the higher median is used as the peak) so that GFLOP/s
can be read against it; timings on a shared machine are noisy, compare ratios within one
run.  The sharded path (``main.py --shards``, teachers in Ray actors that read their data
from disk) is measured by ``scripts/bench_shards.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
from typing import Any, Sequence

from dclens.common import machine  # noqa: E402
from dclens.common import tf_env

if __name__ == "__main__":
    tf_env.prepare_cli_environment()     # before TensorFlow is imported; see dclens/common/tf_env.py
    tf_env.import_tensorflow_quietly()

from dclens.experiments import bench
from dclens.datalens import teacher_conv  # noqa: E402
from dclens.datalens.config import Aggregation  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="bench.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", choices=sorted(bench.SPECS),
                        help="configuration to run (repeatable; default fmnist-200)")
    parser.add_argument("--steps", type=int, default=3, help="timed generator steps")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--teachers", type=int,
                        help="teachers actually run; fewer than the config's -> extrapolated")
    parser.add_argument("--chunk", type=int, help="teachers per chunk (default: config's)")
    parser.add_argument("--bank", choices=("auto", "ram", "disk"), default="auto",
                        help="where the teacher bank lives (auto: disk if > half the RAM)")
    parser.add_argument("--bank_dir", help="folder for a disk bank (default: a temporary "
                                           "folder in the current directory)")
    parser.add_argument("--bank_ram_gib", type=float,
                        help="teachers kept in RAM by a disk bank, in GiB (default: half the "
                             "RAM; 0: every teacher streams from disk)")
    parser.add_argument("--bank_io", choices=("auto", "direct", "buffered"), default="auto",
                        help="how a disk bank's rows move: past the page cache with O_DIRECT "
                             "where the file system takes it (auto, the default), always "
                             "(direct), or through the page cache (buffered)")
    parser.add_argument("--ensemble", choices=("fast", "reference"), default="fast")
    parser.add_argument("--no_overlap", action="store_true",
                        help="teacher state I/O in the main thread (no prefetch/write-behind)")
    parser.add_argument("--conv_path", choices=teacher_conv.CONV_PATH_CHOICES, default="auto",
                        help="the teachers' path (dclens/datalens/teacher_conv.py): auto, the fused "
                        "C++ teacher step (fused), or TF's per-op kernels (per_teacher, "
                        "grouped)")
    parser.add_argument("--aggregation", action="append",
                        choices=[a.value for a in Aggregation],
                        help="vote mechanism (repeatable: each configuration runs with each, "
                             "in turn; default the preset's, the paper's TopAgg). The paper's "
                             "Table 6 is TopAgg vs klevel (D2P-Fed) vs fetchsgd")
    parser.add_argument("--out", help="also write the JSON to this file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = args.config or ["fmnist-200"]
    load_before = os.getloadavg()
    peak_before = bench.matmul_peak_gflops()
    results: list[dict[str, Any]] = []
    aggregations = [Aggregation(a) for a in args.aggregation] if args.aggregation else [None]
    for name in names:
        spec = bench.SPECS[name]
        measured = min(args.teachers, spec.num_teachers) if args.teachers else None
        for aggregation in aggregations:
            label = name + (f" ({aggregation.value})" if aggregation else "")
            started = time.perf_counter()
            try:
                result = bench.run_bench(
                    spec, steps=args.steps, warmup=args.warmup, options=bench.BenchOptions(
                        measured_teachers=measured, chunk=args.chunk, bank=args.bank,
                        bank_dir=args.bank_dir, ensemble=args.ensemble,
                        overlap_io=not args.no_overlap,
                        bank_direct_io={"auto": None, "direct": True,
                                        "buffered": False}[args.bank_io],
                        bank_ram_bytes=(None if args.bank_ram_gib is None
                                        else int(args.bank_ram_gib * bench.GIB)),
                        conv_path=args.conv_path, aggregation=aggregation))
            except (OSError, RuntimeError, ValueError) as error:
                result = {"config": name, "error": f"{type(error).__name__}: {error}"}
                if aggregation is not None:
                    result["aggregation"] = aggregation.value
            result["full_bank_on_disk"] = bench.disk_status(args.bank_dir or os.getcwd(),
                                                            spec)
            result["wall_seconds"] = time.perf_counter() - started
            results.append(result)
            print(f"[bench] {label} done in {result['wall_seconds']:.0f} s", file=sys.stderr)
    peak_after = bench.matmul_peak_gflops()
    # The machine is shared: the less loaded of the two measurements is its peak.
    peak = max(peak_before["median_gflops"], peak_after["median_gflops"])
    for result in results:
        for part in ("measured", "extrapolated"):
            if part in result:
                bench.add_peak_fractions(result[part], peak)
    report = {
        "machine": {"cpus": os.cpu_count(), "cpu_model": machine.cpu_model_name(),
                    "cpu_vector_extensions": machine.cpu_vector_extensions(),
                    "onednn_enabled": machine.onednn_enabled(),
                    "tf_enable_onednn_opts": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
                    "tensorflow": bench.tf.__version__,
                    "load_average_before": load_before,
                    "load_average_after": os.getloadavg(),
                    "matmul_float32_before": peak_before,
                    "matmul_float32_after": peak_after},
        "results": results,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text + "\n")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
