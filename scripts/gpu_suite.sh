#!/usr/bin/env bash
# The GPU suite, on the GPU machine (device tool), from the bundle scripts/gpu_bundle.sh made:
#   scripts/gpu_suite.sh [tarball] [step...]      (tarball default .gpu/tessera-gpu.tar.xz)
# Steps (default: all, in this order):
#   env      what the machine is: GPU, driver, glibc, where CUDA's libraries are
#   gpu      test_gpu: the CUDA device itself
#   suites   the differential suites with TESSERA_DEVICE_TYPE=GPU (every default mesh on GPUs)
#   cuda     test_cuda_renderer (every kernel rendered, compiled by this machine's NVRTC)
#   samples  mnist_dp and embed_jit on GPU meshes
#   bench    bench/gpu_bench, then bench/gpu_peers.py (PyTorch on the same cases)
# Each step's output goes to the terminal and to $OUT/<step>.log (or /tmp/gpu-suite/ without
# $OUT); the last lines are a PASS/FAIL table.
set -uo pipefail
cd "$(dirname "$0")/.."
tarball=${1:-.gpu/tessera-gpu.tar.xz}
shift || true
steps=("$@")
((${#steps[@]})) || steps=(env gpu suites cuda samples bench)
out=${OUT:-/tmp/gpu-suite}
mkdir -p "$out"
root=/tmp/tessera-gpu
[[ -x $root/run.sh ]] || tar -xJf "$tarball" -C /tmp || { echo "gpu_suite: cannot unpack $tarball"; exit 1; }
run=$root/run.sh
export TESSERA_CACHE_DIR=/tmp/tessera-cache
results=()

record() {  # record NAME COMMAND...: runs it, logs it, remembers PASS/FAIL
  local name=$1
  shift
  local start=$SECONDS
  if timeout "${TESSERA_STEP_TIMEOUT:-300}" "$@" >> "$out/$current.log" 2>&1; then results+=("PASS $name $((SECONDS - start))s")
  else results+=("FAIL($?) $name $((SECONDS - start))s"); tail -30 "$out/$current.log"; fi
}

for current in "${steps[@]}"; do
  : > "$out/$current.log"
  case $current in
    env)
      { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv; ldd --version | head -1
        cat "$root"/BUILD_INFO; "$run" true; cat "$root"/.cuda_libdirs; } >> "$out/env.log" 2>&1
      cat "$out/env.log" ;;
    gpu) record test_gpu env TESSERA_DEVICE_TYPE=GPU "$run" test_gpu ;;
    suites)
      for suite in ops redistribute fuzz autodiff local_map training transformer_ops optimizers gpt; do
        record "test_${suite}_gpu" env TESSERA_DEVICE_TYPE=GPU "$run" "test_$suite"
      done ;;
    cuda) record test_cuda_renderer "$run" test_cuda_renderer ;;
    samples)
      record "mnist_dp --device gpu" "$run" mnist_dp --device gpu --train-limit 2048 --epochs 1 --expect-accuracy 0.6
      record "embed_jit (GPU)" env TESSERA_DEVICE_TYPE=GPU "$run" embed_jit ;;
    bench)
      record gpu_bench "$run" gpu_bench
      cat "$out/bench.log"
      record gpu_peers.py env PYTHONUNBUFFERED=1 python3 bench/gpu_peers.py
      tail -12 "$out/bench.log" ;;
    *) echo "gpu_suite: unknown step $current"; exit 2 ;;
  esac
done
printf '%s\n' "${results[@]}"
for r in "${results[@]}"; do [[ $r == PASS* ]] || exit 1; done
