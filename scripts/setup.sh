#!/usr/bin/env bash
# Installs everything dclens needs on a fresh Debian/Ubuntu machine (idempotent):
# the real Fashion-MNIST from Debian's dataset-fashion-mnist, and the Python packages.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq dataset-fashion-mnist
fi
python -m pip install -q --disable-pip-version-check --root-user-action=ignore -r requirements.txt
