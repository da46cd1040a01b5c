"""The fused teacher step's profiling harness (ops/teacher_profile.cc, `make -C ops
teacher-profile`): it builds, runs at a tiny size, and its sections tile the step.

The harness only measures (the kernel's numbers are tested in tests/test_teacher_op.py);
this keeps it from rotting and checks what its JSON claims: the sections' times add up to
the step's wall time, and its GEMM work is the network's (computed here from the layer
shapes, independently of the C++).
"""

import json
import math
import pathlib
import subprocess

import pytest

from conftest import build_ops_harness, needs_compiler

from dclens.datalens import networks



@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return build_ops_harness(tmp_path_factory, "teacher-profile", "teacher_profile")


def _gemm_flops(n: int, training: bool) -> float:
    """2 x multiply-adds of the GEMMs of one pass of the Fashion-MNIST teacher."""
    k, c = 10, 1
    c0, c1, dense = c + k, networks.DISCRIMINATOR_FILTERS + k, networks.DISCRIMINATOR_DENSE
    rows0, rows1, flat = n * 14 * 14, n * 7 * 7, 7 * 7 * c1
    conv0, conv1, dense2 = rows0 * 25 * c * c0, rows1 * 25 * c0 * c1, n * flat * dense
    # forward (conv0, conv1, dense2), then the input gradients of dense2 and conv1, then
    # either the three kernel gradients (training) or conv0's input gradient (queries)
    forward_and_back = conv0 + conv1 + dense2 + dense2 + conv1
    return 2.0 * (forward_and_back + (dense2 + conv1 + conv0 if training else conv0))


@needs_compiler
def test_the_profile_sections_tile_the_step_and_count_the_networks_gemms(harness):
    # 20 repeats (0.4 s): a preemption landing in the loop's bookkeeping, outside the laps,
    # is spread over 40 passes; with 2 repeats one of a few ms could push the wall time past
    # the laps' sum by more than the tolerance below.
    repeats = 20
    result = subprocess.run([str(harness), "--teachers", "2", "--repeats", str(repeats),
                             "--batch", "4"], check=True, capture_output=True, text=True)
    report = json.loads(result.stdout)
    assert report["parameters_per_teacher"] == sum(
        math.prod(shape) for _, shape in
        networks.discriminator_weight_shapes(networks.ImageShape(28, 28, 1, 10)))
    assert report["single_thread_gemm_peak_gflops"] > 0
    # The kernel's GEMM follows the CPU the harness was built for (ops/small_gemm.h).
    cpu = pathlib.Path("/proc/cpuinfo")
    if cpu.exists():
        flags = set(next((line.split(":", 1)[1].split() for line in
                          cpu.read_text().splitlines() if line.startswith("flags")), []))
        small = {"avx2", "fma"} <= flags and "avx512f" not in flags
        assert report["kernel_gemm"] == ("small_gemm" if small else "eigen")
    for name, images, training, passes in (("training_step", 8, True, 2 * repeats * 2),
                                           ("image_gradient_query", 4, False, 2 * repeats)):
        part = report[name]
        assert part["images_per_pass"] == images and part["passes"] == passes
        assert part["gemm_flop_per_pass"] == pytest.approx(_gemm_flops(images, training),
                                                             rel=1e-9)
        sections = part["sections"]
        assert sum(s["share"] for s in sections.values()) == pytest.approx(1.0, abs=1e-3)
        # The laps tile the timed loop: only the loop's own bookkeeping is outside them.
        assert part["seconds_per_pass"] == pytest.approx(part["wall_seconds_per_pass"],
                                                         rel=0.05)
        assert ("adam" in sections) == training
        assert ("input_gradient" in sections) == (not training)


@needs_compiler
def test_the_profile_harness_refuses_bad_flags_by_name(harness):
    for argv, quoted in ((["--teachers", "0"], "--teachers"), (["--speed", "1"], "--speed"),
                         (["--batch"], "--batch")):
        result = subprocess.run([str(harness), *argv], capture_output=True, text=True)
        assert result.returncode == 2 and quoted in result.stderr, result.stderr
