#!/usr/bin/env bash
# Random-program fuzzing beyond the test suite's 300 cases (not part of CI): N programs against
# the reference evaluator with the LLVM kernels, then N/5 with every kernel interpreted.
# Usage: scripts/fuzz.sh [N=10000] [first seed=1]
set -euo pipefail
cd "$(dirname "$0")/.."
cases=${1:-10000}
seed=${2:-1}
scripts/build.sh >/dev/null
time build/test/fuzz_programs --cases "$cases" --seed "$seed"
time build/test/fuzz_programs --cases "$((cases / 5))" --seed "$seed" --interpreted
