#!/usr/bin/env bash
# README command 2: install dependencies, build, run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
meson test -C build --print-errorlogs "$@"
