"""The cost of streaming a disk teacher bank, buffered and O_DIRECT, with no compute.

Prints JSON: per I/O mode and pass, wall seconds, GiB/s, and CPU seconds per GiB moved of
this process and of the whole machine (the kernel's writeback and reclaim included); see
dclens/experiments/bank_io.py.  Example (a 2.5 GiB bank of Fashion-MNIST teachers):

    python scripts/bench_bank_io.py --teachers 400 --passes 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Sequence

from dclens.common import export, machine
from dclens.datalens import networks, teacher_bank, teachers
from dclens.experiments import bank_io

GIB = 2 ** 30


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="bench_bank_io.py",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teachers", type=int, default=400,
                        help="teachers in the bank (Fashion-MNIST's: 6.7 MB each)")
    parser.add_argument("--chunk", type=int, default=10, help="teachers per chunk")
    parser.add_argument("--passes", type=int, default=2, help="timed passes per mode")
    parser.add_argument("--mode", action="append", choices=("buffered", "direct"),
                        help="I/O mode (repeatable; default both)")
    parser.add_argument("--dir", help="folder for the bank (default: the current one)")
    parser.add_argument("--out", help="also write the JSON to this file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    options = bank_io.BankIOOptions(teachers=args.teachers, chunk=args.chunk,
                                    passes=args.passes,
                                    modes=tuple(args.mode or ("buffered", "direct")),
                                    directory=args.dir)
    directory = args.dir or os.getcwd()
    layout = teachers.ParamLayout.for_shape(networks.ImageShape(28, 28, 1, 10))
    needed = teacher_bank.bank_file_bytes(layout, options.teachers)
    free = shutil.disk_usage(directory).free
    if needed > free:
        print(f"error: a bank of {options.teachers} teachers needs {needed / GIB:.1f} GiB in "
              f"{directory}, only {free / GIB:.1f} GiB are free; use --teachers fewer or "
              f"--dir elsewhere", file=sys.stderr)
        return 2
    try:
        results = bank_io.measure(options)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    report = {"machine": {"cpus": os.cpu_count(), "cpu_model": machine.cpu_model_name(),
                          "load_average_before": list(os.getloadavg())},
              "bank_gib": needed / GIB, "results": results}
    print(json.dumps(report, indent=2))
    if args.out:
        export.write_json(args.out, report)
    return 0
