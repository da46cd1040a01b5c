"""Reproducing the paper: Table 1 runs, the analysis tables, and the benchmarks."""
