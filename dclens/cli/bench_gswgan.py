"""Times GS-WGAN's two phases on this machine and projects the paper's run from them.

Prints one JSON object.  For each --model_dim:

* warm-start: seconds per (discriminator x iteration) when --chunks pairs are trained
  together in one graph (chunk 1 = one pair at a time), B = --batch_size, 5 critic steps
  each; the median over --repeats timed iterations after one untimed (tracing) iteration;
  the speed-up of each chunk over chunk 1;
* DP phase: seconds per iteration (bank row in, 5 critic steps, the sanitized generator
  step, EMA, bank row out), same median;
* the warm-start's modelled FLOPs per iteration (``models.warm_iteration_flops``, a stated
  model) over its time, as a fraction of the float32 matmul peak measured in the same run:
  near 1, batching more discriminators into one graph cannot make it faster;
* the projection of the paper's run (1000 discriminators x 2000 warm-start iterations,
  20000 DP iterations) at the best chunk: hours, the stated model being "measured seconds
  per unit x units", nothing else.

The float32 matmul peak of this machine (``dclens.experiments.bench.matmul_peak_gflops``), measured in
the same run, is reported beside the times so runs on different machines can be set side by
side as ratios.  Data: random images (timing only).

Usage: python scripts/bench_gswgan.py [--model_dim 64 16] [--chunks 1 2 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

from dclens.common import machine  # noqa: E402
from dclens.common import tf_env
from dclens.experiments import bench
from dclens.gswgan import discriminators, models, steps, train
from dclens.gswgan.config import GswganConfig
from dclens.common.rng import SeedTree, Stream

PAPER = {"discriminators": 1000, "warm_iterations": 2000, "iterations": 20000}



def bench_model_dim(model_dim: int, chunks: list[int], batch: int, repeats: int) -> dict:
    import numpy as np
    import tensorflow as tf


    seeds = SeedTree(0)
    rng = np.random.default_rng(0)
    config = GswganConfig(model_dim=model_dim, batch_size=batch, seed=0)
    warm = {}
    for chunk in chunks:
        pairs = discriminators.WarmPairs(config, chunk, 10)
        base_seeds = pairs.reset(list(range(chunk)), seeds)
        real = rng.uniform(size=(chunk, config.critic_iters, batch, 28, 28, 1)).astype(np.float32)
        labels = rng.integers(0, 10, size=(chunk, config.critic_iters, batch))
        counter = iter(range(10 ** 6))
        seconds = bench.median_seconds(
            lambda: pairs.step(real, labels, base_seeds, np.int64(next(counter))), repeats)
        warm[str(chunk)] = {"seconds_per_step": seconds,
                            "seconds_per_discriminator_iteration": seconds / chunk}
    base = warm[str(chunks[0])]["seconds_per_discriminator_iteration"]
    for entry in warm.values():
        entry["speedup_over_first_chunk"] = base / entry["seconds_per_discriminator_iteration"]
    best = min(warm.values(), key=lambda e: e["seconds_per_discriminator_iteration"])

    nets = train.DpNetworks(config, seeds, 10, sigma=1.0)
    with tempfile.TemporaryDirectory() as folder:
        bank = discriminators.DiscriminatorBank(f"{folder}/bank.npy", nets.discriminator, nets.d_opt,
                                       4, create=True)
        for index in range(4):
            bank.store(index, nets.discriminator, nets.d_opt)
        images = rng.uniform(size=(64, 28, 28, 1)).astype(np.float32)
        image_labels = rng.integers(0, 10, 64)
        counter = iter(range(10 ** 6))

        def dp_iteration():
            t = next(counter)
            chosen = t % 4
            bank.load(chosen, nets.discriminator, nets.d_opt)
            real, real_labels = discriminators.real_batches(images, image_labels, np.arange(64),
                                                   rng, config.critic_iters, batch)
            nets.critic(real, real_labels, np.int64(t))
            z = steps.bernoulli_latent(seeds.tf_seed(Stream.LATENT, t), batch, config.z_dim)
            y = steps.uniform_labels(seeds.tf_seed(Stream.QUERY_LABELS, t), batch, 10)
            noise = tf.random.stateless_normal((batch, 28, 28, 1),
                                               seed=seeds.tf_seed(Stream.DP_NOISE, t))
            nets.generator_step(z, y, noise)
            nets.follow(t)
            bank.store(chosen, nets.discriminator, nets.d_opt)

        dp_seconds = bench.median_seconds(dp_iteration, repeats)
    parameters = {"generator": int(sum(np.prod(w.shape) for w in
                                       nets.generator.trainable_weights)),
                  "discriminator": int(sum(np.prod(w.shape) for w in
                                           nets.discriminator.trainable_weights))}
    flops = models.warm_iteration_flops(model_dim, batch, config.critic_iters)
    for entry in warm.values():
        entry["model_gflops_per_second"] = flops / entry[
            "seconds_per_discriminator_iteration"] / 1e9
    warm_hours = (PAPER["discriminators"] * PAPER["warm_iterations"]
                  * best["seconds_per_discriminator_iteration"] / 3600)
    dp_hours = PAPER["iterations"] * dp_seconds / 3600
    return {"model_dim": model_dim, "parameters": parameters,
            "warm_iteration_gflop_model": flops / 1e9, "warm_start": warm,
            "dp_seconds_per_iteration": dp_seconds,
            "projection_paper_run_hours": {"warm_start": warm_hours, "dp_phase": dp_hours,
                                           "total": warm_hours + dp_hours,
                                           "model": "measured seconds per unit x the "
                                                    "paper's units (1000 x 2000 warm-start, "
                                                    "20000 DP iterations)"}}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_dim", type=int, nargs="+", default=[64, 16])
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if any(c < 1 for c in args.chunks) or args.repeats < 1:
        parser.error(f"--chunks {args.chunks} and --repeats {args.repeats} must be >= 1")

    peak = bench.matmul_peak_gflops()
    results = [bench_model_dim(m, args.chunks, args.batch_size, args.repeats)
               for m in args.model_dim]
    for result in results:
        for entry in result["warm_start"].values():
            entry["fraction_of_matmul_peak"] = (entry["model_gflops_per_second"]
                                                / peak["median_gflops"])
    print(json.dumps({"cpu": machine.cpu_model_name(),
                      "cpu_vector_extensions": machine.cpu_vector_extensions(),
                      "onednn": machine.onednn_enabled(), "matmul_peak": peak,
                      "batch_size": args.batch_size, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    tf_env.prepare_cli_environment()
    tf_env.import_tensorflow_quietly()
    sys.exit(main())
