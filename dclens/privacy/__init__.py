"""Privacy accounting, with no TensorFlow and no files: the RDP ledgers of Gaussian and
sampled-Gaussian mechanisms, the (epsilon, delta) conversions, and the data-dependent
analysis (reported, never spent)."""
