#!/usr/bin/env bash
# README command 1: install dependencies, build, and train the main sample (data-parallel
# Fashion-MNIST, 3 epochs) on virtual CPU devices. Extra arguments go to the sample.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
./build/samples/mnist_dp --out build/mnist_dp_out --checkpoint build/mnist_dp_out/checkpoint "$@"
