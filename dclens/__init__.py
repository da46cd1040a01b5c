"""dclens: differentially private image generation by gradient voting (DataLens) and its relatives (GS-WGAN, DP-SGD, GEP) on shared data, privacy, run-directory and evaluation layers."""
