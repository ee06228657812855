#!/usr/bin/env bash
# The GPU suite, on the GPU machine (device tool), from the bundle scripts/gpu_bundle.sh made:
#   scripts/gpu_suite.sh [tarball] [step...]      (tarball default .gpu/tessera-gpu.tar.xz)
# Steps (default: all, in this order):
#   env      what the machine is: GPU, driver, glibc, where CUDA's libraries are
#   gpu      test_gpu: the CUDA device itself
#   suites   the differential suites with TESSERA_DEVICE_TYPE=GPU (every default mesh on GPUs)
#   cuda     test_cuda_renderer (every kernel rendered, compiled by this machine's NVRTC)
#   samples  mnist_dp and embed_jit on GPU meshes
#   bench    bench/gpu_bench, bench/grouped_matmul_bench --device gpu (bf16, f32), then
#            bench/gpu_peers.py (PyTorch on the same cases)
#   plan     bench/plan_bench --accuracy --gpu: the GPT step on one GPU, predicted with the
#            h100-sxm profile against measured (time, and peak memory to the byte); then again with
#            this GPU's measured profile (--calibrate-gpu), which it saves as gpu_profile.json
#   attention  causal attention fwd+bwd at T = 1k/4k/8k, 2 x 8 heads x 128: bench/attention_bench
#            --device gpu (Tessera's flash and math backends, bf16 and f32), then
#            bench/attention_gpu_peers.py (PyTorch's SDPA backends on the same shapes)
#   gpt      samples/gpt on one GPU (--mesh dp=1), then bench/gpt_gpu_peers.py (PyTorch eager and
#            torch.compile on the same model, batches and optimizer), both at the sample's default
#            sizes for $TESSERA_GPT_STEPS (500) steps on the bundle's data/fortunes; each ends
#            with a `summary` line: median step time, tokens/s, validation loss
# Each program's output goes to /tmp/gpu-suite/<step>.<program>.log, packed at the end into
# $OUT/gpu-suite-logs.tar.gz where $OUT is set (the device tool's folder); all
# but attention, bench, plan and gpt run side by side, $TESSERA_GPU_SUITE_JOBS (6) at a time, then
# attention, bench, plan and gpt, each alone. The last lines are a PASS/FAIL table, with the tail of each failing log.
set -uo pipefail
cd "$(dirname "$0")/.."
tarball=${1:-.gpu/tessera-gpu.tar.xz}
shift || true
steps=("$@")
((${#steps[@]})) || steps=(env gpu suites cuda samples bench plan attention gpt)
out=/tmp/gpu-suite  # logs; packed into $OUT/gpu-suite-logs.tar.gz at the end (the device tool returns 8 files)
mkdir -p "$out"
root=/tmp/tessera-gpu
[[ -x $root/run.sh ]] || tar -xJf "$tarball" -C /tmp || { echo "gpu_suite: cannot unpack $tarball"; exit 1; }
run=$root/run.sh
export TESSERA_CACHE_DIR=/tmp/tessera-cache
jobs=${TESSERA_GPU_SUITE_JOBS:-6}

# record STEP NAME COMMAND...: runs it into $out/STEP.NAME.log and leaves its PASS/FAIL line in
# $out/STEP.NAME.result; run in the background, several at once (the GPU machine has 16 cores).
record() {
  local step=$1 name=$2
  shift 2
  local file="$out/$step.${name//[^A-Za-z0-9_.-]/_}"
  local start=$SECONDS
  if timeout "${TESSERA_STEP_TIMEOUT:-300}" "$@" > "$file.log" 2>&1; then echo "PASS $name $((SECONDS - start))s" > "$file.result"
  else echo "FAIL($?) $name $((SECONDS - start))s" > "$file.result"; fi
}
throttle() { while (($(jobs -rp | wc -l) >= jobs)); do wait -n; done; }

# The steps' commands, one "STEP NAME COMMAND..." per call; bench, plan and gpt run alone, after the rest.
parallel_steps=()
for current in "${steps[@]}"; do
  case $current in
    env)
      { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv; ldd --version | head -1
        cat "$root"/BUILD_INFO; "$run" true; cat "$root"/.cuda_libdirs; } > "$out/env.log" 2>&1
      cat "$out/env.log" ;;
    gpu|suites|cuda|samples|bench|plan|attention|gpt) parallel_steps+=("$current") ;;
    *) echo "gpu_suite: unknown step $current"; exit 2 ;;
  esac
done
rm -f "$out"/*.result
for current in "${parallel_steps[@]}"; do
  case $current in
    gpu) throttle; record gpu test_gpu env TESSERA_DEVICE_TYPE=GPU "$run" test_gpu & ;;
    suites)
      # The longest first, so the last to start are short.
      for suite in fuzz gpt ops autodiff training transformer_ops ring_attention moe redistribute local_map optimizers all_to_all_v \
                 parallelizable_model grouped_matmul; do
        throttle; record suites "test_${suite}_gpu" env TESSERA_DEVICE_TYPE=GPU "$run" "test_$suite" &
      done ;;
    cuda) throttle; record cuda test_cuda_renderer "$run" test_cuda_renderer & ;;
    samples)
      throttle; record samples "mnist_dp --device gpu" "$run" mnist_dp --device gpu --train-limit 2048 --epochs 1 --expect-accuracy 0.6 &
      throttle; record samples "embed_jit (GPU)" env TESSERA_DEVICE_TYPE=GPU "$run" embed_jit & ;;
  esac
done
wait
if [[ " ${parallel_steps[*]} " == *" attention "* ]]; then
  shapes=(--batch 2 --heads 8 --features 128 --lengths 1024,4096,8192)
  for dtype in bf16 f32; do
    record attention "attention_bench $dtype" "$run" attention_bench --device gpu --dtype $dtype "${shapes[@]}"
    cat "$out/attention.attention_bench_$dtype.log"
    record attention "attention_gpu_peers.py $dtype" env PYTHONUNBUFFERED=1 python3 bench/attention_gpu_peers.py --dtype $dtype "${shapes[@]}"
    cat "$out/attention.attention_gpu_peers.py_$dtype.log"
  done
fi
if [[ " ${parallel_steps[*]} " == *" bench "* ]]; then
  record bench gpu_bench "$run" gpu_bench
  cat "$out/bench.gpu_bench.log"
  # A mixture of experts' GEMMs (backend/cuda/grouped_gemm.cu) against cuBLAS's one GEMM of the same FLOPs.
  for dtype in bf16 f32; do
    record bench "grouped_matmul_bench $dtype" "$run" grouped_matmul_bench --device gpu --dtype $dtype --experts 8 \
      --tokens 16384 --k 2048 --f 5632 --rounds 3
    cat "$out/bench.grouped_matmul_bench_$dtype.log"
  done
  record bench gpu_peers.py env PYTHONUNBUFFERED=1 python3 bench/gpu_peers.py
  tail -12 "$out/bench.gpu_peers.py.log"
fi
if [[ " ${parallel_steps[*]} " == *" plan "* ]]; then
  sizes=(--rounds 3 --layers 4 --width 128 --heads 4 --context 128 --vocab 96 --batch 32)
  record plan "plan_bench --accuracy --gpu" "$run" plan_bench --accuracy --gpu "${sizes[@]}"
  tail -6 "$out/plan.plan_bench_--accuracy_--gpu.log"
  # Again with this GPU's measured profile (calibrate_gpu on the published one of its kind),
  # saved as $out/gpu_profile.json.
  base=h100-sxm
  nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | grep -q H200 && base=h200
  record plan "plan_bench --accuracy --gpu --calibrate-gpu" "$run" plan_bench --accuracy --gpu --calibrate-gpu $base \
    --save-profile "$out/gpu_profile.json" "${sizes[@]}"
  tail -6 "$out/plan.plan_bench_--accuracy_--gpu_--calibrate-gpu.log"
fi
if [[ " ${parallel_steps[*]} " == *" gpt "* ]]; then
  # The GPT sample and PyTorch on the same sizes, data and steps (the sample's defaults but the
  # step count, which its schedule spans: warmup 100, cosine to step N); one device, no dp split.
  fortunes=$root/data/fortunes
  [[ -d $fortunes ]] || fortunes=/usr/share/games/fortunes
  [[ -d $fortunes ]] || echo "gpu_suite: no fortunes in the bundle ($root/data/fortunes) nor in /usr/share/games: gpt will fail"
  gpt_args=(--layers 4 --width 128 --heads 4 --context 128 --batch-size 32 --steps "${TESSERA_GPT_STEPS:-500}" --data "$fortunes")
  record gpt "gpt --device gpu" "$run" gpt --device gpu --mesh dp=1 "${gpt_args[@]}" --out "$out/gpt_out"
  grep -aE '^(GPT|step 0|first step|summary)' "$out/gpt.gpt_--device_gpu.log"
  record gpt gpt_gpu_peers.py env PYTHONUNBUFFERED=1 python3 bench/gpt_gpu_peers.py "${gpt_args[@]}"
  grep -aE '^(GPT|---|step 0|first step|summary|.* FAILED|\()' "$out/gpt.gpt_gpu_peers.py.log"
fi
status=0
for result in "$out"/*.result; do
  [[ -e $result ]] || continue
  line=$(cat "$result")
  echo "$line"
  if [[ $line != PASS* ]]; then
    status=1
    tail -30 "${result%.result}.log"
  fi
done
[[ -n ${OUT:-} ]] && tar -czf "$OUT/gpu-suite-logs.tar.gz" -C "$out" .
exit $status
