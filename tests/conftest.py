"""Shared fixtures: a tiny Fashion-MNIST-shaped IDX data set made by the tests.

The test process runs TensorFlow as the command-line tools do (:mod:`dclens.common.tf_env`:
oneDNN on and quiet C++ logs unless the environment says otherwise), set here before any
test module imports TensorFlow, so the suite behaves alike on CPUs whose oneDNN default
differs.  tests/test_teacher_conv.py runs a job with oneDNN off and on in subprocesses.
"""

import gzip
import os
import pathlib
import shutil
import signal
import struct
import subprocess
import sys

from dclens.common import tf_env

tf_env.prepare_cli_environment()

import numpy as np
import pytest


def load_script(name: str):
    """The tool behind ``scripts/<name>.py``: the module ``dclens.cli.<name>`` (the script
    is a shim into it), so tests can call its ``main`` / ``build_parser``."""
    import importlib

    return importlib.import_module(f"dclens.cli.{name}")


def run_tool(name: str, argv: list[str]) -> tuple[int, str]:
    """Runs ``scripts/<name>.py argv`` in-process: (exit status, what it printed on
    stderr); stdout is discarded."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = load_script(name).main(argv)
        except SystemExit as exit_:
            code = exit_.code
    return code, err.getvalue()


def write_idx(path, array: np.ndarray) -> None:
    """Writes a uint8 IDX file (gzipped when the name ends in .gz)."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += b"".join(struct.pack(">I", d) for d in array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as stream:
        stream.write(payload)


def synthetic_fashion_mnist(count: int, seed: int = 0):
    """``count`` uniform-noise 28x28x1 images with labels cycling through the 10 classes,
    as a Fashion-MNIST ``LabeledImages`` (for tests that need shapes, not content)."""
    from dclens import data

    rng = np.random.default_rng(seed)
    return data.LabeledImages(rng.uniform(size=(count, 28, 28, 1)).astype(np.float32),
                              (np.arange(count) % 10).astype(np.int64),
                              data.dataset_spec("fashion_mnist"), "synthetic")


def band_images(count: int, seed: int):
    """``count`` learnable Fashion-MNIST-shaped images: class c is a bright band at rows
    2c+2..2c+5 over faint noise (for tests whose classifiers must learn something)."""
    from dclens import data

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, count)
    images = rng.uniform(0, 0.3, size=(count, 28, 28, 1)).astype(np.float32)
    for i, label in enumerate(labels):
        images[i, 2 * label + 2:2 * label + 6, 4:24, 0] = 0.9
    return data.LabeledImages(images, labels.astype(np.int64),
                              data.dataset_spec("fashion_mnist"), f"synthetic-{seed}")


def snapshot(folder) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes), to show nothing changed."""
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as stream:
                found[os.path.relpath(path, folder)] = stream.read()
    return found


@pytest.fixture(scope="session")
def tiny_fmnist_dir(tmp_path_factory):
    """<root>/fashion_mnist/{train,t10k}-*-ubyte.gz with 120 / 40 class-dependent images.

    Each class c is a bright horizontal bar at rows 2c..2c+4 plus noise, so a conditional
    generator has something label-dependent to learn.
    """
    root = tmp_path_factory.mktemp("data")
    folder = root / "fashion_mnist"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for prefix, count in (("train", 120), ("t10k", 40)):
        labels = np.arange(count) % 10
        images = rng.integers(0, 60, size=(count, 28, 28))
        for i, label in enumerate(labels):
            images[i, 2 * label + 2:2 * label + 6, 4:24] = 230
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return root


@pytest.fixture
def ctrl_c_is_python_s():
    """SIGINT as an interactive ``python`` has it (``KeyboardInterrupt``), for the length of
    a test: the suite may itself run as a background job (``pytest &``), which a shell
    starts with SIGINT ignored, and a tool keeps an ignored signal ignored."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


#: The ops folder; its harnesses (make targets) are built per test module.
OPS = pathlib.Path(__file__).resolve().parents[1] / "ops"
#: Tests of the C++ harnesses need a compiler (scripts/setup.sh installs g++ and make).
needs_compiler = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("make") is None,
                                    reason="needs g++ and make (scripts/setup.sh installs them)")


def build_ops_harness(tmp_path_factory, target: str, executable: str) -> pathlib.Path:
    """Builds ``make -C ops <target>`` into a fresh folder; returns the executable."""
    build = tmp_path_factory.mktemp(f"{target}-build")
    subprocess.run(["make", "-s", "-C", str(OPS), target, f"BUILD={build}",
                    f"PYTHON={sys.executable}"], check=True, capture_output=True, text=True)
    return build / executable
