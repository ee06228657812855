#!/usr/bin/env bash
# README command 1: install dependencies, build, run the main sample on virtual CPU devices.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
./build/samples/dtensor_basics "$@"
