"""Private classifiers trained with DP-SGD, its TopAgg variant and GEP (issue 16).

:mod:`dclens.dpsgd.mechanisms`: per-example gradients, clipping, NormTopK, the aggregation
and its ``dp_accounting`` event; :mod:`dclens.dpsgd.gep`: Gradient Embedding Perturbation
(anchor bases, embedding / residual clipping and noise, its shared-batch event);
:mod:`dclens.dpsgd.models`: the classifiers; :mod:`dclens.dpsgd.config`: a run's settings;
:mod:`dclens.dpsgd.train`: the loop (Poisson batches, write-ahead journal of a
:class:`dclens.sampled_ledger.SampledGaussianLedger`, checkpoints, resume), behind
``scripts/dpsgd.py``.
"""
