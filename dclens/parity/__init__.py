"""Side-by-side runs against the authors' TF1 DataLens code (see side_by_side.py)."""
