"""The teacher kernel's GEMM (ops/small_gemm.h) against its reference loop, bit for bit.

``ops/small_gemm_check.cc`` (``make -C ops small-gemm-check``) multiplies random matrices
(shapes 1-70, k up to 900, row- and column-major operands and results with padded leading
dimensions) and the teacher step's own products, each through the driver and through both
orientations, and counts the result elements whose bits differ from the plain loop
``acc = fma(a, b, acc)`` over k in order.  Every element must match: that is the property
that makes a teacher's result independent of its tile, orientation and chunk.

On a CPU without AVX2/FMA, or with AVX-512, the kernel keeps Eigen's GEMM and the harness
reports ``small_gemm_built: false`` (checked against /proc/cpuinfo, so a build that
silently fell back would fail here).
"""

import json
import pathlib
import subprocess

import pytest

from conftest import build_ops_harness, needs_compiler

from dclens.datalens import networks



def _cpu_flags() -> set[str]:
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    return build_ops_harness(tmp_path_factory, "small-gemm-check", "small_gemm_check")


def _run(checker, *argv):
    result = subprocess.run([str(checker), *argv], capture_output=True, text=True)
    return result.returncode, json.loads(result.stdout) if result.stdout.strip() else None


@needs_compiler
@pytest.mark.parametrize("seed", [0, 1])
def test_every_product_equals_the_fma_loop_bit_for_bit(checker, seed):
    code, report = _run(checker, "--cases", "250", "--seed", str(seed))
    flags = _cpu_flags()
    expected_built = {"avx2", "fma"} <= flags and "avx512f" not in flags
    if flags:
        assert report["small_gemm_built"] == expected_built, flags
    if not report["small_gemm_built"]:
        pytest.skip("this CPU keeps Eigen's GEMM (no AVX2/FMA, or AVX-512)")
    # 250 random cases and the 9 teacher products, each three ways.
    assert report["cases"] == 250 + 9 and report["products"] == 3 * report["cases"]
    assert report["mismatched_elements"] == 0, report["first_mismatch_mnk"]
    assert code == 0


@needs_compiler
def test_the_bench_times_the_teachers_products(checker):
    code, report = _run(checker, "--cases", "1", "--bench", "--repeats", "1")
    assert code == 0
    products = {row["product"]: row for row in report["bench"]}
    assert {"dense2_forward", "dense2_kernel_gradient", "dense2_input_gradient",
            "conv1_forward", "conv1_kernel_gradient", "conv1_patch_gradient"} <= set(products)
    row = products["dense2_forward"]
    # A training pass's 30 images, the Fashion-MNIST teacher's dense layer on its flattened
    # 7 x 7 x (filters + 10 label maps) activations.
    flat = 7 * 7 * (networks.DISCRIMINATOR_FILTERS + 10)
    assert (row["m"], row["n"], row["k"]) == (30, networks.DISCRIMINATOR_DENSE, flat)
    assert row["eigen_gflops"] > 0
    if report["small_gemm_built"]:
        assert row["small_gemm_gflops"] > 0 and row["speedup"] > 0


@needs_compiler
def test_the_checker_refuses_bad_flags_by_name(checker):
    for argv, quoted in ((["--speed", "1"], "--speed"), (["--cases"], "--cases")):
        result = subprocess.run([str(checker), *argv], capture_output=True, text=True)
        assert result.returncode == 2 and quoted in result.stderr, result.stderr
