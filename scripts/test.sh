#!/usr/bin/env bash
# README command 2: install dependencies, build, run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
echo "== scripts/test.sh: built ($((SECONDS / 60)) min $((SECONDS % 60)) s)"
# Debian's NVRTC is installed (scripts/install_deps.sh): every CUDA kernel the suite generates must compile.
export TESSERA_REQUIRE_NVRTC=1
meson test -C build --print-errorlogs "$@"
