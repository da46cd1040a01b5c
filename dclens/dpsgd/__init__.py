"""Private classifiers trained with DP-SGD and its TopAgg variant (issue 16; in progress).

:mod:`dclens.dpsgd.mechanisms`: per-example gradients, clipping, NormTopK, the aggregation
and its ``dp_accounting`` event; :mod:`dclens.dpsgd.gep`: Gradient Embedding Perturbation
(anchor bases, embedding / residual clipping and noise, its shared-batch event);
:mod:`dclens.dpsgd.models`: the classifiers.  Not yet: the training loop and CLI.
"""
