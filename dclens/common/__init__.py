"""Shared plumbing with no privacy and no algorithm in it: atomic file output, explicit
randomness, timing, the TensorFlow process environment and CPU facts, setting checks,
report helpers."""
