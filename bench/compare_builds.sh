#!/usr/bin/env bash
# Before/after on one machine, in one run: the same benchmarks from two build folders,
# interleaved round by round (so a noisy stretch of the machine hits both), printing each
# round's key lines side by side. Build the old commit in a worktree first, e.g.
#   git worktree add /tmp/base <commit> && (cd /tmp/base && meson setup build-base \
#     --native-file scripts/native.ini -Dtests=false -Dsamples=false && \
#     ninja -C build-base bench/training_bench bench/gpt_bench bench/compiler_bench)
#   bench/compare_builds.sh /tmp/base/build-base build [rounds]
# The benchmarks' peers (libtorch, OpenBLAS) run in the new build's processes only where it has them.
set -euo pipefail
old=$1 new=$2 rounds=${3:-2}
key_lines() {  # the lines that carry the figures compared
  grep -E "^Tessera, |host overhead|per call|compile of the training step|^cold:|^warm:|^ (1024|2048)\^3" || true
}
for ((r = 1; r <= rounds; ++r)); do
  for side in old new; do
    dir=${!side}
    echo "== round $r, $side ($dir)"
    "$dir"/bench/training_bench 2>&1 | key_lines
    "$dir"/bench/compiler_bench 2>&1 | key_lines
    "$dir"/bench/gpt_bench --steps 20 2>&1 | key_lines
  done
done
