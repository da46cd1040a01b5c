#!/usr/bin/env bash
# Installs everything dclens needs on a fresh Debian/Ubuntu machine (idempotent):
# the real Fashion-MNIST from Debian's dataset-fashion-mnist, a C++ compiler and make
# (for the TopAgg custom op), the Python packages, dclens itself (pip install -e .), and
# then builds the op (make -C ops).
set -euo pipefail
cd "$(dirname "$0")/.."
APT_PACKAGES=()
[ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] \
  || APT_PACKAGES+=(dataset-fashion-mnist)
command -v g++ >/dev/null 2>&1 || APT_PACKAGES+=(g++)
command -v make >/dev/null 2>&1 || APT_PACKAGES+=(make)
if [ "${#APT_PACKAGES[@]}" -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${APT_PACKAGES[@]}"
fi
python -m pip install -q --disable-pip-version-check --root-user-action=ignore -r requirements.txt
# dclens itself, editable: `import dclens` works from any folder, and the compiled ops
# (built in place below) stay beside the package.
python -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps \
  --no-build-isolation -e .
# The TopAgg custom op, ops/_dclens_ops.so (rebuilt only when its sources or TF change).
make -s -C ops PYTHON=python
