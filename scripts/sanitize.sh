#!/usr/bin/env bash
# The test suite under sanitizers (called by .ci/run after the README's test command):
#  - AddressSanitizer + UndefinedBehaviorSanitizer: every test, MPI ones included (OpenMPI's
#    own leaks are suppressed in scripts/lsan.supp, nothing else) but those that repeat one code
#    path over many meshes or plans, which the plain build runs: the suites mpi_heavy (the
#    four-process run and the GPT sample's mpirun meshes: 14 minutes on two cores) and sweep
#    (sixty runs of the GPT sample, the pipeline's mesh sweeps, auto_parallelize's searches and the plan sample's:
#    8 minutes; one search is kept) and calibration (a calibration beside processes spinning on
#    every core: minutes under ASan, for the code the quiet calibration cases run); and 100 of the
#    plain run's 300 random programs through the compile cache's cold, warm and disk paths;
#  - ThreadSanitizer: the in-process suites (device threads, collectives, the JIT) and
#    auto_parallelize's planning threads.
# Builds in build-asan/ and build-tsan/ at -O1 without debug info (compile time dominates).
# Each phase prints its end time; the last measured ones are in docs/ROBUSTNESS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
scripts/install_deps.sh
# No benchmarks: no test runs them, and their libtorch translation units are the slowest to compile.
# Unity builds, as scripts/build.sh's.
common=(--native-file scripts/native.ini -Db_lundef=false -Dbuildtype=plain -Doptimization=1 -Ddebug=false -Dbenchmarks=false
  -Dunity=on -Dunity_size=6)

# UBSan's null and alignment checks are left out: at -O1 they made each file compile 40% longer
# (8 partitioner files: 81 s, 57 without them), and a null dereference still stops the test with
# ASan's report and stack; x86-64 host code has no alignment faults to find.
phase() { echo "== sanitize.sh: $1 ($((SECONDS / 60)) min $((SECONDS % 60)) s)"; }
[[ -f build-asan/build.ninja ]] || meson setup build-asan "${common[@]}" -Db_sanitize=address,undefined \
  -Dcpp_args=-fno-sanitize=null,alignment
ninja -C build-asan
phase "ASan+UBSan build done"
# allocator_may_return_null: an allocation too large for the machine must reach Tessera's own
# check (an Error) instead of ending the test.
asan="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0:allocator_may_return_null=1"
export LSAN_OPTIONS="suppressions=$root/scripts/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# NVRTC off: its compiles of every CUDA kernel (test_cuda_renderer, a minute) exercise NVIDIA's
# uninstrumented library, not Tessera's code, and the plain run has done them.
TESSERA_CACHE_FUZZ_CASES=100 TESSERA_NVRTC_LIBRARY=none ASAN_OPTIONS="$asan" meson test -C build-asan --print-errorlogs --timeout-multiplier 4 --no-suite mpi --no-suite install \
  --no-suite sweep --no-suite calibration
TESSERA_NVRTC_LIBRARY=none ASAN_OPTIONS="$asan" build-asan/test/test_planning --test-case='auto_parallelize picks the fastest plan that fits*'
phase "ASan+UBSan in-process suites done"
# The MPI suite. OpenMPI's libraries have no frame pointers and unload their plugins at exit: its
# leaks are only recognised (and suppressed) with full unwinding and the plugins kept loaded,
# which makes every allocation about ten times slower (three cases of test_mpi: 418 s, 43 with
# the fast unwinder). So the suite runs with the fast unwinder and no leak check (memory errors
# and UB still stop it), and leaks are checked on test_mpi over two processes (MPI and shared
# memory) but for its sweep of every collective at many sizes: 21 s, where that case alone
# takes 232 s so. The other cases allocate through the same collectives.
TESSERA_NVRTC_LIBRARY=none ASAN_OPTIONS="${asan/detect_leaks=1/detect_leaks=0}" \
  meson test -C build-asan --print-errorlogs --timeout-multiplier 4 --suite mpi --no-suite mpi_heavy
OMPI_MCA_mca_base_component_disable_dlclose=1 TESSERA_NVRTC_LIBRARY=none \
ASAN_OPTIONS="$asan:fast_unwind_on_malloc=0" LSAN_OPTIONS="$LSAN_OPTIONS:fast_unwind_on_malloc=0" \
  meson test -C build-asan --print-errorlogs --timeout-multiplier 4 mpi_np2 --test-args="'--test-case-exclude=every collective through*'"
phase "ASan+UBSan MPI suite done"

[[ -f build-tsan/build.ninja ]] || meson setup build-tsan "${common[@]}" -Db_sanitize=thread
# Only what the TSan run runs is built (the other suites, samples and MPI drivers would take
# minutes of CI to compile for nothing).
tsan_suites=(mesh layout array tensor redistribute comm ops compiler autodiff local_map mesh_transfer training module semantics partial)
ninja -C build-tsan test/cache_probe test/checkpoint_writer test/test_planning "${tsan_suites[@]/#/test/test_}"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
phase "TSan build done"
meson test -C build-tsan --no-rebuild --print-errorlogs --timeout-multiplier 4 "${tsan_suites[@]}"
# auto_parallelize's planning threads: their test case only (all of test_planning takes minutes under TSan).
build-tsan/test/test_planning --test-case='auto_parallelize plans on several threads*'
phase "TSan suites done"
unset TSAN_OPTIONS
