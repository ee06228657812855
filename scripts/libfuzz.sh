#!/usr/bin/env bash
# libFuzzer on the untrusted-input readers: the checkpoint loader and the IDX reader
# (test/fuzz/). Usage: scripts/libfuzz.sh [seconds per target, default 60]
# Configures (once) build-fuzz/ with clang++-14, -Dfuzzers=true and ASan + UBSan, builds the
# library and the targets only, then runs each target for the given time on its corpus in
# build-fuzz/corpus/<target> (seeded by the target itself when empty, kept between runs).
# Exits non-zero on any finding: a crash, an exception that is not a tessera::Error, a sanitizer
# report (UB, memory error, leak), an input slower than 10 s, or more than 2 GB of memory.
# Findings are written to build-fuzz/artifacts/<target>/; reproduce one with
#   build-fuzz/test/fuzz/<target> build-fuzz/artifacts/<target>/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
seconds=${1:-60}
TESSERA_INSTALL_FUZZ=1 scripts/install_deps.sh

if [[ ! -f build-fuzz/build.ninja ]]; then
  CXX=clang++-14 meson setup build-fuzz --native-file scripts/native.ini \
    -Dfuzzers=true -Dtests=false -Dbenchmarks=false -Dsamples=false \
    -Dcuda=disabled \
    -Db_sanitize=address,undefined -Db_lundef=false \
    -Dbuildtype=plain -Doptimization=1 -Ddebug=false \
    -Dcpp_args="-gline-tables-only -fno-sanitize-recover=all"
fi
ninja -C build-fuzz -j "${TESSERA_FUZZ_JOBS:-2}" test/fuzz/fuzz_checkpoint_index test/fuzz/fuzz_idx_reader

# allocator_may_return_null: an allocation too large for the machine must reach Tessera's own
# check (an Error), as in scripts/sanitize.sh.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
status=0
for target in fuzz_checkpoint_index fuzz_idx_reader; do
  corpus=build-fuzz/corpus/$target artifacts=build-fuzz/artifacts/$target
  mkdir -p "$corpus" "$artifacts"
  echo "libfuzz: $target for ${seconds} s"
  # (pipefail: the pipeline fails when the target does)
  if ! "build-fuzz/test/fuzz/$target" "$corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
       -artifact_prefix="$root/$artifacts/" -print_final_stats=1 2>&1 | tee "build-fuzz/$target.log"; then
    echo "libfuzz: $target FOUND A PROBLEM (see build-fuzz/$target.log and $artifacts/)" >&2
    status=1
  fi
done
exit $status
