"""Where dclens lives on disk: the package, the repository around it, and the compiled
ops (built in place by ``make -C ops``; an editable install keeps them beside the
package)."""

from __future__ import annotations

from pathlib import Path

#: The ``dclens`` package folder.
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
#: The repository (or source tree) that holds the package, ``ops/`` and ``scripts/``.
REPO_ROOT = PACKAGE_ROOT.parent
#: The compiled TopAgg and teacher ops (``ops/_dclens_*.so``).
OPS_DIR = REPO_ROOT / "ops"
