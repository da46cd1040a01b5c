"""GS-WGAN (Chen, Orekondy, Fritz, NeurIPS 2020) on dclens' data, ledger, journal,
checkpoints and export: gradient-sanitized WGAN with many discriminators on disjoint
shards.  :mod:`.train` has the algorithm, :mod:`.steps` the sanitizer, :mod:`.accounting`
the provable and the paper's accounting, :mod:`.models` the networks."""
