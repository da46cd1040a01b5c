"""DP-MERF (Harder et al., AISTATS 2021): a generator fitted to one private release of the
data's class-conditional mean embedding in random Fourier features.

The release is one Gaussian mechanism on a sum of unit-norm feature-times-label matrices
(:mod:`~dclens.datalens.merf.mechanism`, replace-one L2 sensitivity 2); fitting the
generator to it is post-processing (:mod:`~dclens.datalens.merf.fit`).  It lives inside
DataLens because it fits DataLens' own generator: a DataLens run can start from the fit and
count the release in its ledger (``scripts/main.py --warm_start RUN``,
:mod:`dclens.datalens.warm_start`); run alone (``scripts/merf.py``) it is DP-MERF, a
relative of DataLens on the same data, accountant and evaluation.
"""
