"""Private classifiers trained with DP-SGD, its TopAgg variant and GEP (issue 16).

:mod:`dclens.dpsgd.per_example`: per-example gradients (layer-wise outer products, and
the ``tf.vectorized_map`` reference); :mod:`dclens.dpsgd.mechanisms`: clipping, NormTopK,
the aggregation and its ``dp_accounting`` event; :mod:`dclens.dpsgd.gep`: Gradient Embedding Perturbation
(anchor bases, embedding / residual clipping and noise, its shared-batch event);
:mod:`dclens.dpsgd.models`: the classifiers; :mod:`dclens.dpsgd.config`: a run's settings;
:mod:`dclens.dpsgd.train`: the loop (Poisson batches, write-ahead journal of a
:class:`dclens.privacy.sampled_ledger.SampledGaussianLedger`, checkpoints, resume), behind
``scripts/dpsgd.py`` (its flags: :mod:`dclens.cli.dpsgd_flags`); :mod:`dclens.dpsgd.sweep`: a grid
of settings chosen on validation (``scripts/dpsgd_sweep.py``); :mod:`dclens.dpsgd.report`:
the results table from the published reports (``scripts/dpsgd_report.py``).
"""
