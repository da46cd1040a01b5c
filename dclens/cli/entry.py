"""Console entry points (``pyproject.toml``): ``dclens-main`` runs what
``python scripts/main.py`` runs, and so on for the other tools."""

from __future__ import annotations

from dclens.cli import run


def main() -> int:
    """``dclens-main``: DataLens with the authors' flags (``scripts/main.py``)."""
    return run("main")


def privacy() -> int:
    """``dclens-privacy``: epsilon, steps or sigma for a configuration."""
    return run("privacy")


def evaluate() -> int:
    """``dclens-evaluate``: downstream classifiers, FID and label agreement of samples."""
    return run("evaluate")


def reproduce() -> int:
    """``dclens-reproduce``: a Table 1 run with its report."""
    return run("reproduce")


def side_by_side() -> int:
    """``dclens-side-by-side``: dclens and the authors' code in lockstep."""
    return run("side_by_side")


def gswgan() -> int:
    """``dclens-gswgan``: GS-WGAN."""
    return run("gswgan")


def dpsgd() -> int:
    """``dclens-dpsgd``: DP-SGD, TopAgg for DP-SGD, GEP."""
    return run("dpsgd")


def merf() -> int:
    """``dclens-merf``: DP-MERF, and the warm start of a DataLens run."""
    return run("merf")
