"""Private classifiers trained with DP-SGD and its TopAgg variant (issue 16; in progress).

:mod:`dclens.dpsgd.mechanisms`: per-example gradients, clipping, NormTopK, the aggregation
and its ``dp_accounting`` event; :mod:`dclens.dpsgd.models`: the classifiers.
"""
