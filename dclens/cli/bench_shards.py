"""The sharded teachers (``main.py --shards``, dclens/datalens/sharded.py): cost and projection; JSON.

  python scripts/bench_shards.py                         # both parts, ~10 min on 2 cores
  python scripts/bench_shards.py --skip_celeba --shards 0,1,2 --teachers 100

Part 1, measured on real Fashion-MNIST (Debian's, or --data_dir): the same seeded config
(``--teachers`` teachers of the paper's 15 records, B = 15) in-process (shards 0) and
with 1 and 2 local Ray actors: median seconds per generator step and the array bytes sent
to / received from the actors per step (the class grid, query batches and sign keys out;
one int32 [B, D] vote sum per shard and round, and the shard's teacher losses, back).  On
one machine the actors share its cores, so 2 actors cannot be faster than 1: this part
measures the overhead of the actor path, not a speed-up.

Part 2, the per-actor step of one CelebA-Gender shard: 750 of the paper's 6000 teachers
(64x64x3, B = 27) with a disk bank, extrapolated linearly from ``--celeba_measured``
teachers (dclens/experiments/bench.py's machinery; all of their state streams from disk).

Projection (a stated model, not a measurement): the CelebA-Gender eps=1 paper run on N
machines of 2 cores / 24 GiB, one actor each: step time = per-teacher seconds x teachers
per machine (Part 2) + the actor path's fixed per-step overhead (Part 1: 1 actor minus
in-process) + the step's bytes over ``--network_gbps``; run time = the steps the eps = 1
budget allows x step time.  Per machine: RAM = its shard's records + the bank's RAM tier
(at most half the RAM); disk = the bank beyond that tier + two shard checkpoints (each
the shard's whole state: the driver's last checkpoint must survive the next one).
``--project_from FILE`` recomputes only the projection from a saved JSON's measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Sequence

from dclens.datalens import teacher_bank
from dclens.common import machine  # noqa: E402
from dclens.common import tf_env

if __name__ == "__main__":
    tf_env.prepare_cli_environment()     # before TensorFlow is imported; see dclens/common/tf_env.py
    tf_env.import_tensorflow_quietly()

from dclens.privacy import accounting
from dclens.experiments import bench
from dclens import data
from dclens.datalens import teachers  # noqa: E402
from dclens.datalens.config import DataLensConfig, preset  # noqa: E402
from dclens.datalens import sharded  # noqa: E402
from dclens.datalens.sharded import ShardOptions  # noqa: E402
from dclens.datalens.shards import plan_shards  # noqa: E402
from dclens.datalens.build import image_shape_of  # noqa: E402
from dclens.datalens.train import DataLens, TeacherPlacement  # noqa: E402
from dclens.common import export

CELEBA_TEACHERS, CELEBA_RECORDS = 6000, 162770
MACHINE_RAM_GIB, MACHINE_CORES = 24, 2


def fmnist_config(teachers_count: int, data_dir: str | None, chunk: int) -> DataLensConfig:
    base = preset("fashion_mnist-eps1")
    return base.replace(train={"num_teachers": teachers_count, "max_records":
                               teachers_count * 15, "data_dir": data_dir, "seed": 0,
                               "teacher_chunk": chunk, "epochs": 1000},
                        budget={"max_eps": 1e9})


def time_sharded(config: DataLensConfig, shards: int, *, steps: int, warmup: int,
                 workdir: str) -> dict[str, Any]:
    """Median seconds per step and bytes per step with ``shards`` actors (0: in-process)."""
    dataset = data.load_dataset(config.train.dataset, config.train.data_dir, split="train",
                                limit=config.train.max_records)
    options = (None if shards == 0 else
               ShardOptions(shards, os.path.join(workdir, f"shards-{shards}")))
    started = time.perf_counter()
    lens = DataLens(config, dataset, root_seed=0, placement=TeacherPlacement(
        launch_teachers=sharded.launcher(options)))
    setup = time.perf_counter() - started
    seconds, sent, received = [], [], []
    try:
        for index in range(warmup + steps):
            before = dict(lens.teachers.traffic) if lens.sharded else None
            record = lens.train_step()
            if index >= warmup:
                seconds.append(record.seconds)
                if before is not None:
                    sent.append(lens.teachers.traffic["sent"] - before["sent"])
                    received.append(lens.teachers.traffic["received"] - before["received"])
    finally:
        if lens.sharded:
            lens.teachers.close()
    out = {"shards": shards, "setup_seconds": round(setup, 2),
           "seconds_per_step_each": [round(s, 3) for s in seconds],
           "seconds_per_step_median": statistics.median(seconds)}
    if sent:
        out.update(bytes_sent_per_step=statistics.median(sent),
                   bytes_received_per_step=statistics.median(received))
    return out


def vote_bytes_per_step(batch: int, dim: int, g_step: int, shards: int) -> int:
    """int32 [B, D] per shard and round, back to the driver."""
    return 4 * batch * dim * g_step * shards


def celeba_shard(measured: int, steps: int, warmup: int, peak: float) -> dict[str, Any]:
    """Part 2: one 750-teacher CelebA-Gender shard, all of its state on disk."""
    spec = bench.BenchSpec("celeba-gender-shard-750", "celebA-gender-eps1",
                           CELEBA_TEACHERS // 8, CELEBA_RECORDS // CELEBA_TEACHERS,
                           "one of 8 shards of the paper's CelebA-Gender eps=1 run")
    return bench.run_bench(spec, steps=steps, warmup=warmup, options=bench.BenchOptions(
        measured_teachers=measured, bank="disk", bank_ram_bytes=0, peak_gflops=peak))


def projection(per_teacher_seconds: float, driver_overhead: float,
               network_gbps: float) -> dict[str, Any]:
    """The stated model of the module docstring for the CelebA-Gender eps=1 paper run."""
    config = preset("celebA-gender-eps1")
    shape = image_shape_of(data.dataset_spec(config.train.dataset))
    layout = teachers.ParamLayout.for_shape(shape)
    partition = CELEBA_RECORDS // CELEBA_TEACHERS
    batch = min(config.train.batch_size, partition)
    steps = accounting.max_steps_within(
        sigma=config.topagg.sigma, topk=config.topagg.topk,
        queries_per_step=batch * config.train.g_step, max_eps=config.budget.max_eps,
        delta=config.budget.delta, conversion=config.budget.conversion,
        orders=accounting.classic_orders(config.budget.max_order))
    grid_bytes = 4 * shape.num_classes * batch * shape.dim
    query_bytes = 4 * batch * (shape.dim + shape.num_classes)
    rows = []
    for machines in (1, 2, 4, 8, 12, 16):
        plan = plan_shards(CELEBA_TEACHERS, machines, config.train.teacher_chunk)
        largest = max(s.count for s in plan)
        sent = machines * (grid_bytes + config.train.g_step * query_bytes)
        back = vote_bytes_per_step(batch, shape.dim, config.train.g_step, machines)
        network = (sent + back) * 8 / (network_gbps * 1e9)
        step = per_teacher_seconds * largest + driver_overhead + network
        bank = teacher_bank.bank_bytes(layout, largest) / 2**30
        records = largest * partition * shape.dim * 4 / 2**30
        ram_tier = min(bank, MACHINE_RAM_GIB / 2)
        rows.append({
            "machines": machines, "teachers_per_machine": largest,
            "step_seconds": round(step, 1), "run_hours": round(steps * step / 3600, 1),
            "network_seconds_per_step": round(network, 3),
            "bank_gib_per_machine": round(bank, 1),
            "ram_gib_per_machine": round(records + ram_tier, 1),
            "disk_gib_per_machine": round(bank - ram_tier + 2 * bank, 1),
            "records_gib_per_machine": round(records, 2)})
    return {"model": "step = per-teacher seconds (measured, 750-teacher shard on disk) x "
                     "teachers per machine + the actor path's fixed overhead (measured) + "
                     "bytes / network; RAM = records + bank RAM tier (<= half the RAM); "
                     "disk = bank beyond the tier + 2 shard checkpoints; "
                     f"network {network_gbps:g} Gbit/s; one actor per machine of "
                     f"{MACHINE_CORES} cores / {MACHINE_RAM_GIB} GiB; a bank over half "
                     "the RAM streams from disk (as measured)",
            "steps_in_budget": steps, "batch": batch, "g_step": config.train.g_step,
            "per_teacher_seconds": per_teacher_seconds, "driver_overhead_seconds":
                driver_overhead, "rows": rows}


def _project(result: dict[str, Any], network_gbps: float) -> dict[str, Any]:
    """The projection from a result's measurements (Part 2's per-teacher seconds, Part 1's
    1-actor overhead over in-process)."""
    extrapolated = result["celeba_shard_750"]["extrapolated"]
    per_teacher = extrapolated["seconds_per_step"] / extrapolated["num_teachers"]
    rows = {r["shards"]: r["seconds_per_step_median"] for r in result["fashion_mnist"]["rows"]}
    overhead = max(0.0, rows[1] - rows[0]) if 1 in rows else 0.0
    return projection(per_teacher, overhead, network_gbps)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False,
                                     prog="bench_shards.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teachers", type=int, default=200, help="Part 1 teachers")
    parser.add_argument("--chunk", type=int, default=10, help="teachers per chunk")
    parser.add_argument("--shards", default="0,1,2", help="Part 1 shard counts (0: "
                        "in-process)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (the "
                        "first epoch's pretraining steps are slower)")
    parser.add_argument("--data_dir", help="data root with fashion_mnist/ (default: Debian's)")
    parser.add_argument("--celeba_measured", type=int, default=8,
                        help="Part 2 teachers actually run (extrapolated to 750)")
    parser.add_argument("--skip_celeba", action="store_true", help="Part 1 only")
    parser.add_argument("--network_gbps", type=float, default=1.0,
                        help="projection: network bandwidth between machines")
    parser.add_argument("--out", help="also write the JSON to this file")
    parser.add_argument("--project_from", help="recompute only the projection from this "
                        "earlier output (its measurements) and print it")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.project_from:
        with open(args.project_from) as stream:
            saved = json.load(stream)
        print(json.dumps(_project(saved, args.network_gbps), indent=2))
        return 0
    try:
        counts = [int(c) for c in args.shards.split(",")]
    except ValueError:
        parser.error(f"--shards {args.shards!r}: a comma-separated list of integers")
    if 0 not in counts or any(c < 0 for c in counts):
        parser.error(f"--shards {args.shards!r}: include 0 (in-process, the baseline) and "
                     "no negative counts")
    peak = bench.matmul_peak_gflops()["median_gflops"]
    result: dict[str, Any] = {"cpu": machine.cpu_model_name(), "cores": os.cpu_count(),
                              "matmul_peak_gflops": peak}
    config = fmnist_config(args.teachers, args.data_dir, args.chunk)
    with tempfile.TemporaryDirectory(prefix="dclens-bench-shards-", dir=os.getcwd()) as work:
        part1 = [time_sharded(config, count, steps=args.steps, warmup=args.warmup,
                              workdir=work) for count in sorted(counts)]
    base = part1[0]["seconds_per_step_median"]
    for row in part1:
        row["ratio_to_in_process"] = row["seconds_per_step_median"] / base
    result["fashion_mnist"] = {"teachers": args.teachers, "teacher_chunk": args.chunk,
                               "batch": 15, "rows": part1}
    if not args.skip_celeba:
        result["celeba_shard_750"] = celeba_shard(args.celeba_measured, 1, 1, peak)
        result["projection_celeba_gender_eps1"] = _project(result, args.network_gbps)
    text = json.dumps(result, indent=2, default=float)
    print(text)
    if args.out:

        export.atomic_write(args.out, lambda stream: stream.write(text + "\n"), mode="w")
    return 0


if __name__ == "__main__":
    sys.exit(main())
