"""The crash-safe run directory every trainer uses: its layout and lifecycle (create,
open, resume), the write-ahead privacy journal, and atomic checkpoints."""
