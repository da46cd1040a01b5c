"""Resumable state of a long classifier-training loop, saved after whole epochs.

A downstream protocol that trains for hours (the authors' 600 epochs of SGD, DPImageBench's
50 epochs of a ResNet) saves, atomically, everything its next epoch depends on -- the
variables, the shuffle generator, the curves so far -- in one npz, and resumes from it on
exactly the trajectory it would have followed.  The file carries a fingerprint of the
settings and inputs; resuming with anything else is refused.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from dclens.common import export


class EpochState:
    """One npz of ``(meta, arrays)`` at ``path`` (None: nothing is saved or loaded).

    ``what`` names the loop in errors (e.g. "an authors-protocol run")."""

    def __init__(self, path, fingerprint: dict, what: str):
        self.path = path
        self.fingerprint = fingerprint
        self.what = what

    def load(self) -> tuple[dict, list[np.ndarray]] | None:
        """(meta, arrays) of the saved epoch, or None when there is none."""
        if self.path is None or not os.path.exists(self.path):
            return None
        with np.load(self.path, allow_pickle=False) as saved:
            meta = json.loads(str(saved["meta"]))
            if meta["fingerprint"] != self.fingerprint:
                changed = sorted(k for k in set(meta["fingerprint"]) | set(self.fingerprint)
                                 if meta["fingerprint"].get(k) != self.fingerprint.get(k))
                raise ValueError(
                    f"{self.path} holds {self.what} with other settings (differs in "
                    f"{', '.join(changed)}); delete it to start over, or evaluate with the "
                    "settings it was started with")
            arrays = [saved[f"w{i}"] for i in range(meta["variables"])]
        return meta, arrays

    def resume(self, variables, rng: np.random.Generator) -> dict | None:
        """Restores the saved epoch into ``variables`` (assignable, in the order they were
        saved) and ``rng``; returns its meta (``epoch``, ``curves``), or None when there
        is nothing saved."""
        loaded = self.load()
        if loaded is None:
            return None
        meta, arrays = loaded
        for variable, value in zip(variables, arrays):
            variable.assign(value)
        rng.bit_generator.state = meta["rng"]
        return meta

    def save(self, epoch: int, rng: np.random.Generator, curves: dict, arrays) -> None:
        """The state after ``epoch``: ``arrays`` (numpy), the generator, the curves."""
        if self.path is None:
            return
        meta = {"fingerprint": self.fingerprint, "epoch": epoch, "curves": curves,
                "rng": rng.bit_generator.state, "variables": len(arrays)}
        named = {f"w{i}": a for i, a in enumerate(arrays)}
        export.atomic_write(self.path, lambda s: np.savez(s, meta=np.array(json.dumps(meta)),
                                                          **named))


def accuracy(predict, images: np.ndarray, labels: np.ndarray,
             batch_size: int = 1000) -> float:
    """Share of ``images`` whose arg-max of ``predict(batch)`` (scores [n, classes]) equals
    ``labels``, in batches of ``batch_size``; nan for none."""
    if len(labels) == 0:
        return float("nan")
    predicted = np.concatenate([
        np.asarray(predict(images[start:start + batch_size])).argmax(axis=1)
        for start in range(0, len(images), batch_size)])
    return float(np.mean(predicted == labels))


def samples_fingerprint(images: np.ndarray, labels: np.ndarray) -> str:
    """A short hash of the evaluated rows (a resume must be of the same samples)."""
    digest = hashlib.sha256(np.ascontiguousarray(images).tobytes())
    digest.update(np.ascontiguousarray(labels).tobytes())
    return digest.hexdigest()[:16]
