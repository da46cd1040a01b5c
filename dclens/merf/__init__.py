"""DP-MERF (Harder et al., AISTATS 2021): a generator fitted to one private release of the
data's class-conditional mean embedding in random Fourier features.

The release is one Gaussian mechanism on a sum of unit-norm feature-times-label matrices
(:mod:`dclens.merf.mechanism`, replace-one L2 sensitivity 2); fitting the generator to it
is post-processing (:mod:`dclens.merf.fit`).  dclens carries it as a relative of DataLens
on the same data, accountant and evaluation, and as DataLens' warm start
(``scripts/main.py --warm_start RUN``): the DataLens run starts its generator from the
fitted one and counts the release in its own ledger.
"""
