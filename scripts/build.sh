#!/usr/bin/env bash
# Configures (once) and builds Tessera in ./build. Usage: scripts/build.sh [meson options...]
# TESSERA_BUILD_TARGETS="samples/mnist_dp ..." builds only those ninja targets and what they
# need (the library); by default everything (tests, benchmarks, samples).
set -euo pipefail
cd "$(dirname "$0")/.."
"$(dirname "$0")/install_deps.sh"
# A unity build: six of the library's files per compiler run, which parses their shared headers
# and instantiates their shared templates once; a clean build takes about half the time. To
# rebuild single files while editing: meson configure build -Dunity=off.
if [[ ! -f build/build.ninja ]]; then
  meson setup build --native-file scripts/native.ini -Dunity=on -Dunity_size=6 "$@"
elif [[ $# -gt 0 ]]; then
  meson configure build "$@"
fi
# Word splitting is wanted: the variable holds a list of targets.
# shellcheck disable=SC2086
ninja -C build ${TESSERA_BUILD_TARGETS:-}
