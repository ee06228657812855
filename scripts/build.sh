#!/usr/bin/env bash
# Configures (once) and builds Tessera in ./build. Usage: scripts/build.sh [meson options...]
set -euo pipefail
cd "$(dirname "$0")/.."
"$(dirname "$0")/install_deps.sh"
if [[ ! -f build/build.ninja ]]; then
  meson setup build --native-file scripts/native.ini "$@"
elif [[ $# -gt 0 ]]; then
  meson configure build "$@"
fi
ninja -C build
