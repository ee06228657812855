#!/usr/bin/env bash
# The GPT sample's promises, on a small model: the same loss curve on every mesh, 1-, 2- and 3-D,
# sequence shards uneven too, with and without activation checkpointing, in f32 and in bf16 mixed
# precision (bitwise under TESSERA_DETERMINISTIC=1), pipelined over stages (pp alone, with dp, tp,
# Megatron's sequence parallelism, sp, fsdp and bf16, 4-D: the same curve as one device with the same microbatches, gpipe and
# looped-bfs, 1f1b, interleaved-1f1b), and a run stopped and resumed
# from its checkpoint ends bitwise where an uninterrupted one does; the Llama-family model
# (--model llama) likewise on data, tensor, sequence and fully sharded meshes and in pipeline
# stages, and the MoE model (in stages too)
# (--model moe) with its experts over ep; context parallelism (cp: ring attention) to within 1e-4.
#   scripts/check_gpt_sample.sh GPT_BINARY OUT_DIR [MPIRUN]
# With MPIRUN (the path of mpirun), the meshes run as 2 processes instead of in one.
set -euo pipefail
gpt=$1 out=$2 mpirun=${3:-}
rm -rf "$out" && mkdir -p "$out"
export TESSERA_DETERMINISTIC=1
small=(--data /usr/share/games/fortunes --layers 2 --width 32 --heads 2 --context 32 --batch-size 8 --steps 20
       --eval-interval 5 --eval-batches 2)
curve() { cut -d, -f1-3 "$1/metrics.csv"; }  # step, train loss, validation loss: 9 digits, the whole float
run() {
  local name=$1 launch=(); shift
  if [[ -n "$mpirun" && "$name" != reference* ]]; then launch=("$mpirun" --oversubscribe -np 2); fi
  local text=(--generate 0); [[ "$*" == *--generate* ]] && text=()  # no text unless asked for
  "${launch[@]}" "$gpt" "${small[@]}" "${text[@]}" --out "$out/$name" "$@" > "$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
}
run reference --mesh dp=1
status=0
check() {  # check NAME ARGS...: the run's curve must equal the reference's (bf16 runs: the 1-device bf16 one;
           # runs with 4 microbatches: the 1-device one with 4)
  local name=$1 reference=reference; shift
  [[ "$*" == *"--precision bf16"* ]] && reference=reference_bf16
  [[ "$*" == *"--microbatches 4"* ]] && reference=reference_microbatches
  [[ "$*" == *"--microbatches 4"* && "$*" == *"--precision bf16"* ]] && reference=reference_microbatches_bf16
  reference=${REF:-$reference}  # REF=... check ...: another reference
  run "$name" "$@"
  if diff <(curve "$out/$reference") <(curve "$out/$name") > "$out/$name.diff"; then echo "same curve: $name ($*)"
  else echo "DIFFERENT curve: $name ($*)"; cat "$out/$name.diff"; status=1; fi
}
close() {  # close NAME ARGS...: ring attention (cp) merges blocks in another order than one device's
           # attention, so its curve equals the reference's to within 1e-4, relative, not bitwise
  local name=$1 reference=${REF:-reference}; shift
  run "$name" "$@"
  if paste -d, <(curve "$out/$reference") <(curve "$out/$name") | awk -F, 'NR > 1 { for (i = 2; i <= 3; i++) {
       d = $i - $(i + 3); if (d < 0) d = -d; if (d > 1e-4 * ($i < 0 ? -$i : $i)) { print "row " NR ": " $0; bad = 1 } } }
       END { exit bad }' > "$out/$name.diff"; then echo "close curve: $name ($*)"
  else echo "DIFFERENT curve: $name ($*)"; cat "$out/$name.diff"; status=1; fi
}
run reference_bf16 --mesh dp=1 --precision bf16
run reference_microbatches --mesh dp=1 --microbatches 4
run reference_microbatches_4_layers --mesh dp=1 --microbatches 4 --layers 4
run reference_microbatches_bf16 --mesh dp=1 --microbatches 4 --precision bf16
run reference_1f1b --mesh dp=1 --microbatches 4 --schedule 1f1b
run reference_1f1b_4_layers --mesh dp=1 --microbatches 4 --layers 4 --schedule 1f1b
check dp2 --mesh dp=2
# Generated text: the characters a model trained on a mesh writes are one device's, for each family.
generated() { sed -n '/^--- generated ---$/,/^-----------------$/p' "$out/$1.log"; }
same_text() {  # same_text NAME REFERENCE
  if [[ -n "$(generated "$2")" ]] && diff <(generated "$2") <(generated "$1") > "$out/$1.text.diff"; then echo "same text: $1"
  else echo "DIFFERENT text: $1 (or none)"; cat "$out/$1.text.diff"; status=1; fi
}
for family in llama moe; do
  mesh=tp=2; [[ $family == moe ]] && mesh=ep=2
  run reference_text_$family --model $family --mesh dp=1 --generate 40
  run text_$family --model $family --mesh $mesh --generate 40
  same_text text_$family reference_text_$family
done
# The Llama-family model (--model llama: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU).
run reference_llama --model llama --mesh dp=1
REF=reference_llama check llama_dp2 --model llama --mesh dp=2
REF=reference_llama check llama_tp2 --model llama --mesh tp=2
# The MoE model (--model moe: dropless experts, dispatched with all_to_all_v over ep).
run reference_moe --model moe --mesh dp=1
REF=reference_moe check moe_ep2 --model moe --mesh ep=2
REF=reference_moe check moe_dp2 --model moe --mesh dp=2
check tp2 --mesh tp=2
close cp2 --mesh cp=2  # ring attention (under mpirun: between 2 processes)
check fsdp2 --mesh dp=2 --fsdp
check sp2 --mesh sp=2
check tp2_sequence_parallel --mesh tp=2 --sequence-parallel
check dp2_full_checkpointing --mesh dp=2 --activation-checkpointing full
check fsdp2_bf16 --mesh dp=2 --fsdp --precision bf16
check pp2 --mesh pp=2 --microbatches 4
REF=reference_microbatches_4_layers check pp2_looped --mesh pp=2 --microbatches 4 --layers 4 --schedule looped-bfs
REF=reference_1f1b check pp2_1f1b --mesh pp=2 --microbatches 4 --schedule 1f1b
REF=reference_1f1b_4_layers check pp2_interleaved_1f1b --mesh pp=2 --microbatches 4 --layers 4 --schedule interleaved-1f1b
if [[ -z "$mpirun" ]]; then
  check tp2_sequence_parallel_selective_checkpointing --mesh tp=2 --sequence-parallel --activation-checkpointing selective
  check sp3_uneven --mesh sp=3
  check dp2_tp2 --mesh dp=2,tp=2
  check dp2_tp2_fsdp --mesh dp=2,tp=2 --fsdp
  check dp2_tp2_sequence_parallel_fsdp --mesh dp=2,tp=2 --sequence-parallel --fsdp
  check dp2_tp2_sp2_fsdp --mesh dp=2,tp=2,sp=2 --fsdp
  check dp2_bf16 --mesh dp=2 --precision bf16
  check tp2_sequence_parallel_bf16 --mesh tp=2 --sequence-parallel --precision bf16
  check dp2_tp2_fsdp_bf16 --mesh dp=2,tp=2 --fsdp --precision bf16
  check dp2_microbatches --mesh dp=2 --microbatches 4
  check pp2_dp2 --mesh pp=2,dp=2 --microbatches 4
  check pp2_tp2 --mesh pp=2,tp=2 --microbatches 4
  check pp2_dp2_tp2 --mesh pp=2,dp=2,tp=2 --microbatches 4
  check pp2_dp2_fsdp_bf16 --mesh pp=2,dp=2 --fsdp --precision bf16 --microbatches 4
  check pp2_sp2 --mesh pp=2,sp=2 --microbatches 4
  check pp2_dp2_tp2_sp2_fsdp --mesh pp=2,dp=2,tp=2,sp=2 --fsdp --microbatches 4
  REF=reference_1f1b check pp2_dp2_tp2_1f1b --mesh pp=2,dp=2,tp=2 --microbatches 4 --schedule 1f1b
  check pp2_tp2_sequence_parallel --mesh pp=2,tp=2 --sequence-parallel --microbatches 4
  REF=reference_1f1b check pp2_dp2_tp2_sequence_parallel_1f1b --mesh pp=2,dp=2,tp=2 --sequence-parallel --microbatches 4 --schedule 1f1b
  REF=reference_llama check llama_dp2_tp2_sequence_parallel_fsdp --model llama --mesh dp=2,tp=2 --sequence-parallel --fsdp
  REF=reference_llama check llama_sp3_uneven --model llama --mesh sp=3
  REF=reference_moe check moe_ep4 --model moe --mesh ep=4
  REF=reference_moe check moe_dp2_ep2 --model moe --mesh dp=2,ep=2
  REF=reference_moe check moe_dp2_ep2_fsdp --model moe --mesh dp=2,ep=2 --fsdp
  REF=reference_moe check moe_ep2_tp2 --model moe --mesh ep=2,tp=2
  # Context parallelism: ring attention beside tensor and data parallelism.
  REF=reference_llama close llama_cp2_tp2 --model llama --mesh cp=2,tp=2
  REF=reference_llama close llama_dp2_cp2 --model llama --mesh dp=2,cp=2
  # The Llama-family model in pipeline stages: 1F1B with tp and dp, the curve of one device with
  # the same 4 microbatches (gradient accumulation there).
  run reference_llama_1f1b --model llama --mesh dp=1 --microbatches 4 --schedule 1f1b
  REF=reference_llama_1f1b check llama_pp2_dp2_tp2_1f1b --model llama --mesh pp=2,dp=2,tp=2 --microbatches 4 --schedule 1f1b
  REF=reference_llama_1f1b close llama_pp2_cp2_1f1b --model llama --mesh pp=2,cp=2 --microbatches 4 --schedule 1f1b  # ring attention in stages
  # The MoE model in stages, its experts over ep (slot 0 holds the dense first layer on stage 0
  # and the MoE layer 1 on stage 1).
  run reference_moe_microbatches --model moe --mesh dp=1 --microbatches 4
  REF=reference_moe_microbatches check moe_pp2_ep2 --model moe --mesh pp=2,ep=2 --microbatches 4
  REF=reference_moe_microbatches check moe_pp2_tp2_sequence_parallel --model moe --mesh pp=2,tp=2 --sequence-parallel --microbatches 4
  # Stopped at step 10 with a checkpoint, then resumed: metrics.csv gets the rest appended.
  run resumed --mesh dp=2 --stop-at 10 --checkpoint "$out/checkpoint"
  check resumed --mesh dp=2 --resume --checkpoint "$out/checkpoint"
  # The same for each family: the MoE's expert biases and the Llama's weights come back whole.
  run resumed_moe --model moe --mesh dp=2,ep=2 --stop-at 10 --checkpoint "$out/checkpoint_moe"
  REF=reference_moe check resumed_moe --model moe --mesh dp=2,ep=2 --resume --checkpoint "$out/checkpoint_moe"
  run resumed_llama --model llama --mesh dp=2,tp=2 --stop-at 10 --checkpoint "$out/checkpoint_llama"
  REF=reference_llama check resumed_llama --model llama --mesh dp=2,tp=2 --resume --checkpoint "$out/checkpoint_llama"
fi
curve "$out/reference"
exit $status
