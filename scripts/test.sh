#!/usr/bin/env bash
# README command 2: install dependencies, build, run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# What the suite runs (meson's meson-test-prereq: the library, the test programs and the samples
# the tests run), not the benchmarks: they are two minutes of a 2-core build, and .ci/run builds
# them after the suite passes. TESSERA_BUILD_TARGETS= (empty) builds everything first.
TESSERA_BUILD_TARGETS=${TESSERA_BUILD_TARGETS-meson-test-prereq} scripts/build.sh
echo "== scripts/test.sh: built ($((SECONDS / 60)) min $((SECONDS % 60)) s)"
# Debian's NVRTC is installed (scripts/install_deps.sh): every CUDA kernel the suite generates must compile.
export TESSERA_REQUIRE_NVRTC=1
meson test -C build --print-errorlogs "$@"
