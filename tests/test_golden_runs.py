"""Golden runs: three tiny seeded runs whose outputs must not change when the code is only
reorganised (the restructuring of the package was checked against them).

One DataLens run (``scripts/main.py``), one GS-WGAN run (``scripts/gswgan.py``) and one
DP-SGD run (``scripts/dpsgd.py``), each with ``--seed`` on the tests' tiny data set.  What
is compared, as SHA-256 digests:

* the privacy record and the ledger (``privacy.json``, ``ledger.json``) with wall-clock
  fields removed -- these are functions of the configuration and the step count, the
  same on every machine;
* the samples (``samples.npz``: the arrays' bytes) and, for DP-SGD, the chosen model's
  weights -- these depend on the CPU's float32 kernels (AVX2 or AVX-512, oneDNN on or
  off, the TensorFlow version), so they are compared only on a machine whose signature
  (:func:`machine_signatures`) has recorded digests.

Recording (after a change that is *meant* to change outputs, never to make a
reorganisation pass)::

    DCLENS_RECORD_GOLDEN=1 python -m pytest -q tests/test_golden_runs.py
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pathlib
import platform

import numpy as np
import pytest

from conftest import load_script

GOLDEN = pathlib.Path(__file__).parent / "golden" / "runs.json"
RECORD = os.environ.get("DCLENS_RECORD_GOLDEN") == "1"

#: Keys whose values are wall-clock times or machine paths, dropped before hashing.
VOLATILE = {"seconds", "seconds_this_call", "started", "finished_at", "time", "wall_seconds",
            "output_dir", "run_dir", "data_dir", "path", "source", "dataset_source"}


def _cpu_identity() -> tuple[str, str, str]:
    """(vendor, family, model) from /proc/cpuinfo ("" where it does not say)."""
    found = {"vendor_id": "", "cpu family": "", "model": ""}
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            name = name.strip()
            if name in found and not found[name]:
                found[name] = value.strip()
    return found["vendor_id"], found["cpu family"], found["model"]


def machine_signatures() -> list[str]:
    """What decides the float32 bits of a run here, most specific first: the CPU's vector
    extensions, oneDNN and TF, with the CPU's vendor, family and model, then with its
    vendor and family, then without either.

    Two AVX-512 CPUs can give different bits (Eigen's kernels are built for this CPU and
    block their products by its caches): an AMD EPYC of family 25 (Zen 4) and one of
    family 26 (Zen 5) do, on the DataLens run.  Digests are recorded under the first
    signature and looked up in this order; the entries recorded before the CPU was part
    of the key carry the family they were recorded on, or none (the AVX2 machine's)."""
    import tensorflow as tf

    from dclens.common import machine

    flags = ""
    with contextlib.suppress(OSError):
        flags = pathlib.Path("/proc/cpuinfo").read_text()
    isa = ("avx512" if " avx512f" in flags else "avx2" if " avx2" in flags
           else platform.machine())
    onednn = "on" if machine.onednn_enabled() else "off"
    tail = f"onednn-{onednn}-tf-{tf.__version__}"
    vendor, family, model = _cpu_identity()
    head = f"{platform.machine()}-{isa}"
    return [f"{head}-{vendor}-family{family}-model{model}-{tail}",
            f"{head}-{vendor}-family{family}-{tail}", f"{head}-{tail}"]


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _json_digest(path: pathlib.Path) -> str:
    canonical = json.dumps(_strip(json.loads(path.read_text())), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _arrays_digest(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with np.load(path, allow_pickle=False) as arrays:
        for name in sorted(arrays.files):
            array = arrays[name]
            digest.update(f"{name}:{array.dtype}:{array.shape}".encode())
            digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _keras_digest(path: pathlib.Path) -> str:
    import keras

    digest = hashlib.sha256()
    for weights in keras.models.load_model(path).get_weights():
        digest.update(np.ascontiguousarray(weights).tobytes())
    return digest.hexdigest()


def _run(script: str, argv: list[str]) -> None:
    cli = load_script(script)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(argv)
    assert code in (0, None), (script, code)


def _datalens(data_dir, out):
    _run("main", ["--train", "--dataset", "fashion_mnist", "--data_dir", str(data_dir),
                  "--checkpoint_dir", str(out), "--batch_teachers", "4", "--batch_size", "5",
                  "--topk", "20", "--sigma", "20", "--thresh", "0.25", "--max_eps", "50",
                  "--z_dim", "8", "--pretrain_teacher", "1", "--num_samples", "20",
                  "--seed", "1", "--conversion", "classic", "--quiet"])
    return {"json": ["privacy.json", "ledger.json"], "arrays": ["samples.npz"]}


def _gswgan(data_dir, out):
    _run("gswgan", ["--run_dir", str(out), "--data_dir", str(data_dir),
                    "--num_discriminators", "4", "--model_dim", "2", "--batch_size", "6",
                    "--critic_iters", "1", "--warm_iterations", "2", "--iterations", "4",
                    "--num_samples", "20", "--seed", "1", "--target_eps", "50", "--quiet"])
    return {"json": ["privacy.json", "ledger.json"], "arrays": ["samples.npz"]}


def _dpsgd(data_dir, out):
    _run("dpsgd", ["--method", "gm", "--data_dir", str(data_dir), "--run_dir", str(out),
                   "--batch_size", "20", "--epochs", "2", "--validation", "20",
                   "--target_eps", "4", "--seed", "5", "--quiet"])
    return {"json": ["privacy.json", "ledger.json"], "keras": ["model.keras"]}


RUNS = {"datalens": _datalens, "gswgan": _gswgan, "dpsgd": _dpsgd}


def _digests(kind: str, data_dir, out: pathlib.Path) -> tuple[dict, dict]:
    files = RUNS[kind](data_dir, out)
    portable = {name: _json_digest(out / name) for name in files["json"]}
    machine = {name: _arrays_digest(out / name) for name in files.get("arrays", [])}
    machine.update({name: _keras_digest(out / name) for name in files.get("keras", [])})
    return portable, machine


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_a_seeded_tiny_run_gives_the_recorded_outputs(kind, tiny_fmnist_dir, tmp_path):
    portable, machine = _digests(kind, tiny_fmnist_dir, tmp_path / kind)
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    signatures = machine_signatures()
    if RECORD:
        entry = golden.setdefault(kind, {"portable": {}, "machines": {}})
        entry["portable"] = portable
        entry["machines"][signatures[0]] = machine
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(golden, indent=2, sort_keys=True) + "\n")
        return
    assert kind in golden, f"no golden for {kind}: record with DCLENS_RECORD_GOLDEN=1"
    assert portable == golden[kind]["portable"], "privacy record or ledger changed"
    recorded = next((golden[kind]["machines"][signature] for signature in signatures
                     if signature in golden[kind]["machines"]), None)
    if recorded is None:
        pytest.skip(f"samples: no digests recorded for this machine ({signatures[0]}); the "
                    f"privacy record and ledger were compared")
    assert machine == recorded, "samples or weights changed"
