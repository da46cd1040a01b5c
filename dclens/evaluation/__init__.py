"""Evaluating synthetic data: downstream classifiers (val / sen protocols and the authors'
protocol), FID and label agreement."""
