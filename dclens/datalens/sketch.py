"""Count sketch for the FetchSGD aggregation (paper Alg. 7), with a provable sensitivity.

A count sketch with ``rows`` x ``columns`` cells hashes coordinate j of a D-vector into
column h_r(j) of row r with sign s_r(j); sketching is linear, and unsketching estimates
coordinate j as the median over rows of s_r(j) S[r, h_r(j)] (Charikar et al. 2002; the
authors use ``CSVec(d, c=10000, r=20)``).  The hashes are drawn once from a public seed:
they do not depend on any data.

**Sensitivity.**  In FetchSGD each teacher adds the sketch of its top-k sign votes v_i, so
the summed sketch is sketch(sum_i v_i).  Replacing one teacher changes the vote sum by a
Delta with ||Delta||_1 <= 2k and |Delta_j| <= 2, and row r of the sketch by
Delta_r[b] = sum_{h_r(j) = b} s_r(j) Delta_j, so |Delta_r[b]| <= sum_{h_r(j)=b} |Delta_j|.
Over vectors |Delta| in [0, 2]^D with sum <= 2k, sum_b (sum_{j in b} |Delta_j|)^2 is a
convex function maximised at a vertex, which fills the buckets holding the most
coordinates first (2 per coordinate) until the 2k mass is spent: that is
:meth:`CountSketch.row_bound`.  The sketch's L2 sensitivity is at most
sqrt(sum_r row_bound_r^2) (:meth:`CountSketch.sensitivity`) -- computed from the public
hashes, by construction, and proven by the adversarial tests in tests/test_sketch.py.  With
no collisions it is 2 sqrt(k * rows).

The authors instead add the noise *after* unsketching and top-k and charge TopAgg's
2 sqrt(k); the unsketched top-k vector is a nonlinear (median, selection) function of all
teachers' votes, and nothing bounds one teacher's effect on it by 2 sqrt(k): that
accounting is available only as a named option whose outputs say it is unproven.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf


class CountSketch:
    """A count sketch of D-vectors with public hashes (see the module docstring)."""

    def __init__(self, dim: int, *, rows: int, columns: int, seed: int = 0):
        for name, value in (("dim", dim), ("rows", rows), ("columns", columns)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        rng = np.random.default_rng(seed)
        self.dim, self.rows, self.columns = dim, rows, columns
        self.buckets = rng.integers(0, columns, size=(rows, dim))
        self.signs = rng.choice(np.array([-1.0, 1.0], np.float32), size=(rows, dim))
        # Flat cell index per (row, coordinate) for one scatter / gather.
        self._cells = tf.constant(self.buckets + columns * np.arange(rows)[:, None], tf.int32)
        self._signs = tf.constant(self.signs)

    def sketch(self, vectors: tf.Tensor) -> tf.Tensor:
        """[N, D] -> [N, rows, columns] (linear)."""
        vectors = tf.convert_to_tensor(vectors, tf.float32)
        signed = vectors[:, None, :] * self._signs[None]                 # [N, rows, D]
        flat = tf.reshape(signed, (-1, self.rows * self.dim))
        cells = tf.reshape(self._cells, (-1,))

        def one(row):
            return tf.math.unsorted_segment_sum(row, cells, self.rows * self.columns)

        table = tf.map_fn(one, flat)
        return tf.reshape(table, (-1, self.rows, self.columns))

    def unsketch(self, tables: tf.Tensor) -> tf.Tensor:
        """[N, rows, columns] -> [N, D]: the median over rows of each coordinate's signed
        cell (the mean of the two middle values for an even number of rows)."""
        tables = tf.convert_to_tensor(tables, tf.float32)
        flat = tf.reshape(tables, (-1, self.rows * self.columns))
        estimates = tf.gather(flat, self._cells, axis=1) * self._signs[None]  # [N, rows, D]
        ordered = tf.sort(estimates, axis=1)
        middle = self.rows // 2
        if self.rows % 2:
            return ordered[:, middle]
        return 0.5 * (ordered[:, middle - 1] + ordered[:, middle])

    def row_bound(self, row: int, *, l1: float, linf: float) -> float:
        """max ||sketch row of Delta||_2 over |Delta_j| <= linf, ||Delta||_1 <= l1."""
        counts = np.sort(np.bincount(self.buckets[row], minlength=self.columns))[::-1]
        total, budget = 0.0, l1
        for count in counts:
            if budget <= 0 or count == 0:
                break
            mass = min(budget, linf * count)
            total += mass ** 2
            budget -= mass
        return math.sqrt(total)

    def sensitivity(self, topk: int) -> float:
        """L2 sensitivity of sketch(sum of top-k sign votes) to one teacher."""
        return math.sqrt(sum(self.row_bound(r, l1=2.0 * topk, linf=2.0) ** 2
                             for r in range(self.rows)))
