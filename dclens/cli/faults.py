"""Fault injection: SIGKILL a small training run, resume it, compare with an uninterrupted run.

    python scripts/faults.py --runs 10                 # Debian Fashion-MNIST, 80 records
    python scripts/faults.py --runs 3 --data_dir D     # <D>/fashion_mnist/*-ubyte(.gz)
    python scripts/faults.py --runs 5 --method gswgan  # GS-WGAN's loop instead
    python scripts/faults.py --runs 6 --shards 2       # teachers in 2 Ray actors

Each trial trains the same tiny seeded config (4 teachers, 5 budgeted steps, a checkpoint
every step) in a fresh directory and kills it with SIGKILL either at a named point of the
loop (the child kills itself there: ``after_spend``, ``after_step``,
``checkpoint_before_commit``, ``after_checkpoint``, ``before_outputs``, at a random step) or
after a random wall time (the parent kills it).  Then it re-runs the same command, which
resumes, and checks against the uninterrupted reference run:

* the ledger is never smaller: at every step, the resumed run's epsilon >= the reference's,
  and so is the ledger's final epsilon (lost spends included);
* the ledger counts exactly the queries of the steps it took plus the journaled lost ones;
* if no spend was lost (the kill fell on a checkpoint boundary), the per-step epsilon curve
  and the final samples are bit-identical to the reference.

With ``--shards N`` the DataLens run holds its teachers in N Ray actors (``main.py
--shards``), and half the named-point kills SIGKILL an *actor* instead of the driver
(``actor@after_spend``, ``actor@after_step``): the driver then stops with a resumable error
(exit 2) before anything further is released, and the same checks apply to the resumed run.

With ``--method gswgan`` the run is a tiny seeded GS-WGAN (4 discriminators, 5 DP
iterations, a checkpoint every iteration; kill points ``after_warm_chunk``, ``after_spend``,
``after_iteration``, ``checkpoint_before_commit``) and the same checks apply per iteration.

Prints one JSON object: runs, kills, resumed, ledger_mismatches (must be 0), and per trial
what happened.  A timed kill that comes after the run has already finished
(``timed_kills_after_the_end``) kills nothing; that trial is checked as an uninterrupted run
(no lost spend, curve and samples identical to the reference).  Exit status 1 if any check
failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time


from dclens.common import tf_env
from dclens.common.paths import REPO_ROOT
from dclens.runs.rundir import RunPaths
from dclens.privacy import accounting
from dclens.datalens import sharded
from dclens.cli import gswgan as gswgan_cli
from dclens.cli import main as main_cli

POINTS = ("after_spend", "after_step", "checkpoint_before_commit", "after_checkpoint",
          "before_outputs")
GSWGAN_POINTS = ("after_warm_chunk", "after_spend", "after_iteration",
                 "checkpoint_before_commit")
METHODS = ("datalens", "gswgan")
TEACHERS, RECORDS, BATCH, SIGMA, TOPK, STEPS = 4, 80, 10, 20.0, 50, 5
EPSILON_TOLERANCE = 1e-9


def budget_for_steps(steps: int) -> float:
    """A classic-conversion max_eps that admits exactly ``steps`` steps of B queries."""

    curve = accounting.epsilon_curve(sigma=SIGMA, topk=TOPK, queries_per_step=BATCH,
                                     steps=steps + 1, delta=1e-5,
                                     conversion=accounting.Conversion.CLASSIC)
    return (curve[steps - 1].epsilon + curve[steps].epsilon) / 2


ACTOR_POINTS = ("after_spend", "after_step")
ACTOR_PREFIX = "actor@"


def main_argv(data_dir: str | None, out: str, *, seed: int = 3,
              shards: int | None = None) -> list[str]:
    """The command line of the small run every trial uses."""
    argv = ["--train", "--dataset", "fashion_mnist", "--batch_teachers", str(TEACHERS),
            "--teachers_batch", "1", "--batch_size", str(BATCH), "--topk", str(TOPK),
            "--sigma", str(SIGMA), "--thresh", "0.25", "--max_eps", repr(budget_for_steps(STEPS)),
            "--conversion", "classic", "--d_step", "1", "--pretrain_teacher", "2",
            "--z_dim", "8", "--seed", str(seed), "--teacher_chunk", "3", "--num_samples", "60",
            "--max_records", str(RECORDS), "--epoch", "10", "--stochastic", "--signsgd",
            "--checkpoint_every", "1", "--checkpoint_dir", out, "--quiet"]
    if shards is not None:
        argv += ["--shards", str(shards)]
    if data_dir is not None:
        argv[3:3] = ["--data_dir", data_dir]
    return argv


def gswgan_argv(data_dir: str | None, out: str, *, seed: int = 3) -> list[str]:
    """The command line (scripts/gswgan.py) of the small GS-WGAN run of ``--method gswgan``."""
    argv = ["--run_dir", out, "--num_discriminators", "4", "--model_dim", "2",
            "--batch_size", "6", "--critic_iters", "1", "--warm_iterations", "1",
            "--warm_chunk", "1", "--iterations", str(STEPS), "--sigma", "2.0",
            "--checkpoint_every", "1", "--log_every", "1", "--num_samples", "40",
            "--seed", str(seed), "--max_records", str(RECORDS), "--quiet"]
    if data_dir is not None:
        argv += ["--data_dir", data_dir]
    return argv


def run_child(argv: list[str], *, kill_at: str | None = None, kill_after: float | None = None,
              timeout: float = 600.0, method: str = "datalens") -> int:
    """Runs ``main.py argv`` (``gswgan.py argv`` for method gswgan) in a child process;
    returns its exit status (-9 if killed)."""
    command = [sys.executable, str(REPO_ROOT / "scripts" / "faults.py"), "child",
               "--method", method]
    if kill_at is not None:
        command += ["--kill_at", kill_at]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    process = subprocess.Popen(command + ["--", *argv], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, env=env)
    try:
        if kill_after is not None:
            try:
                process.wait(timeout=kill_after)
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGKILL)
        _, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    if process.returncode not in (0, -signal.SIGKILL):
        sys.stderr.write(err.decode(errors="replace")[-3000:])
    return process.returncode


def outcome(out: str) -> dict:
    """What a finished run left: its epsilon curve, ledger and a hash of its samples."""
    with open(os.path.join(out, "privacy.json")) as stream:
        privacy = json.load(stream)
    with open(os.path.join(out, "ledger.json")) as stream:
        journal = json.load(stream)
    import numpy as np

    samples = np.load(RunPaths(out).samples)["x"]
    return {"curve": privacy["epsilon_per_step"], "steps": privacy["steps"],
            "epsilon": privacy["epsilon"]["epsilon"],
            "queries": journal["queries"], "lost_queries": privacy["lost_queries"],
            "queries_per_step": BATCH,
            "samples_sha256": hashlib.sha256(samples.tobytes()).hexdigest()}


def gswgan_outcome(out: str) -> dict:
    """:func:`outcome` for a GS-WGAN run (one journaled spend per DP iteration)."""
    with open(RunPaths(out).report) as stream:
        report = json.load(stream)
    with open(os.path.join(out, "ledger.json")) as stream:
        journal = json.load(stream)
    import numpy as np

    privacy = report["privacy"]
    if privacy["stop_reason"] != "iterations":
        raise RuntimeError(f"{out}: the run stopped on {privacy['stop_reason']!r}; the fault "
                           "runs must complete their --iterations (raise --target_eps)")
    samples = np.load(RunPaths(out).samples)["x"]
    # The iterations the run completed come from its settings, not from the journal,
    # so that compare()'s "queries = steps + lost" check tests the journal.
    return {"curve": [{"step": p["iteration"], "epsilon": p["epsilon"]}
                      for p in report["curves"]],
            "steps": report["config"]["iterations"],
            "epsilon": privacy["epsilon"]["epsilon"],
            "queries": journal["queries"], "lost_queries": privacy["lost_iterations"],
            "queries_per_step": 1,
            "samples_sha256": hashlib.sha256(samples.tobytes()).hexdigest()}


def compare(reference: dict, resumed: dict) -> list[str]:
    """The checks of the module docstring; returns the failures (empty = all hold)."""
    failures = []
    by_step = {point["step"]: point["epsilon"] for point in reference["curve"]}
    for point in resumed["curve"]:
        want = by_step.get(point["step"])
        if want is not None and point["epsilon"] < want * (1 - EPSILON_TOLERANCE):
            failures.append(f"step {point['step']}: epsilon {point['epsilon']} < "
                            f"uninterrupted {want}")
    # The ledger's total (lost spends included) -- not the curve's last point, which
    # misses a spend lost after the last completed step.  The runs stop on a budget that
    # admits whole steps only (GS-WGAN: on its iteration count), so a resumed run spends
    # at least what the uninterrupted one did.
    if resumed["epsilon"] < reference["epsilon"] * (1 - EPSILON_TOLERANCE):
        failures.append(f"the ledger's epsilon {resumed['epsilon']} < uninterrupted "
                        f"{reference['epsilon']}")
    per_step = resumed["queries_per_step"]
    if resumed["queries"] != resumed["steps"] * per_step + resumed["lost_queries"]:
        failures.append(f"ledger counts {resumed['queries']} queries, expected "
                        f"{resumed['steps']} steps x {per_step} + "
                        f"{resumed['lost_queries']} lost")
    if resumed["lost_queries"] == 0:
        if resumed["curve"] != reference["curve"]:
            failures.append("no spend was lost but the epsilon curve differs")
        if resumed["samples_sha256"] != reference["samples_sha256"]:
            failures.append("no spend was lost but the samples differ")
    return failures


def _argv(method: str, data_dir: str | None, out: str, shards: int | None) -> list[str]:
    if method == "gswgan":
        return gswgan_argv(data_dir, out)
    return main_argv(data_dir, out, shards=shards)


def trial(rng: random.Random, workdir: str, data_dir: str | None, reference: dict,
          reference_seconds: float, index: int, method: str = "datalens",
          shards: int | None = None) -> dict:
    out = os.path.join(workdir, f"trial-{index}")
    argv = _argv(method, data_dir, out, shards)
    if shards is not None and rng.random() < 0.5:
        point = rng.choice(ACTOR_POINTS)
        step = rng.randrange(0, STEPS) if point == "after_spend" else rng.randrange(1, STEPS)
        kill = {"kill_at": f"{ACTOR_PREFIX}{point}:{step}"}
    elif rng.random() < 0.25:
        kill = {"kill_after": round(rng.uniform(0.2, 1.0) * reference_seconds, 2)}
    elif method == "gswgan":
        point = rng.choice(GSWGAN_POINTS)
        # after_spend: the iteration index (0..STEPS-1); after_warm_chunk: discriminators
        # done (2 or 4); the others: iterations done (1..STEPS).
        step = {"after_spend": rng.randrange(0, STEPS),
                "after_warm_chunk": rng.choice((2, 4))}.get(point,
                                                          rng.randrange(1, STEPS + 1))
        kill = {"kill_at": f"{point}:{step}"}
    else:
        point = rng.choice(POINTS)
        # after_spend fires with the index of the step being taken (0..STEPS-1), the
        # others with the number of steps done (1..STEPS; before_outputs only at the end).
        step = {"after_spend": rng.randrange(0, STEPS),
                "before_outputs": STEPS}.get(point, rng.randrange(1, STEPS + 1))
        kill = {"kill_at": f"{point}:{step}"}
    first = run_child(argv, method=method, **kill)
    actor_kill = kill.get("kill_at", "").startswith(ACTOR_PREFIX)
    # An actor's death is a clean, resumable error of the driver (exit 2).
    killed = first == (2 if actor_kill else -signal.SIGKILL)
    second = run_child(argv, method=method)
    record = {"trial": index, **kill, "killed": killed, "first_exit": first,
              "resume_exit": second}
    # A timed kill can come after a fast run has already finished: nothing was killed, and
    # the second command finds a finished run.  That trial is an uninterrupted run, checked
    # as one (no lost spend, identical to the reference), not a ledger mismatch.
    landed_late = "kill_after" in kill and first == 0
    record["kill_landed"] = not landed_late
    if not killed and not landed_late:
        record["failures"] = [f"the killed run exited with {first}"]
        return record
    if second != 0:
        record["failures"] = [f"the resumed run exited with {second}"]
        return record
    resumed = (gswgan_outcome if method == "gswgan" else outcome)(out)
    record.update(lost_queries=resumed["lost_queries"], steps=resumed["steps"],
                  final_epsilon=resumed["epsilon"],
                  failures=compare(reference, resumed))
    shutil.rmtree(out, ignore_errors=True)
    return record


def run_trials(runs: int, *, seed: int, data_dir: str | None, workdir: str,
               method: str = "datalens", shards: int | None = None) -> dict:
    rng = random.Random(seed)
    reference_dir = os.path.join(workdir, "reference")
    started = time.perf_counter()
    argv = _argv(method, data_dir, reference_dir, shards)
    code = run_child(argv, method=method)
    if code != 0:
        raise SystemExit(f"faults.py: the uninterrupted reference run failed (exit {code})")
    reference_seconds = time.perf_counter() - started
    reference = (gswgan_outcome if method == "gswgan" else outcome)(reference_dir)
    trials = [trial(rng, workdir, data_dir, reference, reference_seconds, i, method, shards)
              for i in range(runs)]
    return {"method": method, "shards": shards, "runs": runs,
            "kills": sum(t["killed"] for t in trials),
            "actor_kills": sum(t["killed"] and t.get("kill_at", "").startswith(ACTOR_PREFIX)
                               for t in trials),
            "resumed": sum(t["killed"] and t["resume_exit"] == 0 for t in trials),
            "timed_kills_after_the_end": sum(not t["kill_landed"] for t in trials),
            "ledger_mismatches": sum(bool(t["failures"]) for t in trials),
            "kills_with_lost_spends": sum(t.get("lost_queries", 0) > 0 for t in trials),
            "reference": {"steps": reference["steps"], "seconds": round(reference_seconds, 1),
                          "final_epsilon": reference["epsilon"]},
            "seed": seed, "trials": trials}


def child(argv: list[str]) -> int:
    """Runs main.py in this process, SIGKILLing itself at ``--kill_at point:step``."""
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="faults.py child")
    parser.add_argument("--kill_at")
    parser.add_argument("--method", choices=METHODS, default="datalens")
    args, rest = parser.parse_known_args(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    target, kill_actor, launched = None, False, []
    if args.kill_at:
        point, _, step = args.kill_at.partition(":")
        kill_actor = point.startswith(ACTOR_PREFIX)
        target = (point.removeprefix(ACTOR_PREFIX), int(step))
    if kill_actor:

        launch = sharded.ShardedTeachers.launch

        def remembered(*a, **k):
            launched.append(launch(*a, **k))
            return launched[-1]

        sharded.ShardedTeachers.launch = remembered

    def hook(point: str, step: int) -> None:
        if (point, step) != target:
            return
        if kill_actor:      # the last shard's actor process, as a crashed node would
            os.kill(launched[-1].infos[-1]["pid"], signal.SIGKILL)
        else:
            os.kill(os.getpid(), signal.SIGKILL)

    cli = gswgan_cli if args.method == "gswgan" else main_cli
    return cli.main(rest, fault_hook=hook)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="kill-and-resume trials")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill points")
    parser.add_argument("--data_dir", help="data root with fashion_mnist/ (default: Debian's)")
    parser.add_argument("--workdir", help="where the runs go (default: a temporary folder)")
    parser.add_argument("--method", choices=METHODS, default="datalens",
                        help="whose training loop to kill (default: datalens)")
    parser.add_argument("--shards", type=int, help="DataLens only: teachers in this many "
                        "Ray actors; half the kills then hit an actor (default: in-process)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "child":
        return child(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    if args.shards is not None and (args.method != "datalens" or args.shards < 1):
        parser.error(f"--shards {args.shards} needs --method datalens and a value >= 1")
    workdir = args.workdir or tempfile.mkdtemp(prefix="dclens-faults-")
    summary = run_trials(args.runs, seed=args.seed, data_dir=args.data_dir, workdir=workdir,
                         method=args.method, shards=args.shards)
    print(json.dumps(summary, indent=2))
    return 1 if summary["ledger_mismatches"] else 0


if __name__ == "__main__":
    tf_env.prepare_cli_environment()     # the children inherit it; see dclens/common/tf_env.py
    sys.exit(main())
