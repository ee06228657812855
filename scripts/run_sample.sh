#!/usr/bin/env bash
# README command 1: install dependencies, build, and train the main sample (data-parallel
# Fashion-MNIST, 3 epochs) on virtual CPU devices. Extra arguments go to the sample. It builds
# the library and this sample only; scripts/test.sh builds the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
TESSERA_BUILD_TARGETS=samples/mnist_dp scripts/build.sh
./build/samples/mnist_dp --out build/mnist_dp_out --checkpoint build/mnist_dp_out/checkpoint "$@"
