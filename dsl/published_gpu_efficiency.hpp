// How far below their datasheets published GPUs run, from published measurements: the
// fraction of the GEMM peak a GEMM of each arithmetic intensity reaches, and the share of an
// NVLink's line rate NCCL's collectives reach. The published profiles (dsl/hardware.cpp) carry
// them, so a plan on them predicts what the hardware does rather than what it could; a lent
// GPU's calibration (plan/hardware_profiles.hpp: calibrate_gpu) replaces them with measured ones.
#pragma once

#include <utility>
#include <vector>

namespace tessera {

// {intensity, fraction of the dense datasheet peak} points of NVIDIA Hopper (sm_90) GEMMs, in
// Hardware::gemm_efficiency's form: bf16 (and f16) operands, and f32 operands on the TF32 units.
const std::vector<std::pair<double, double>>& hopper_bf16_gemm_efficiency();
const std::vector<std::pair<double, double>>& hopper_tf32_gemm_efficiency();

// The share of the f32 vector rate Tessera's CUDA fused attention (backend/cuda/flash_attention.cu,
// on the CUDA cores) reaches, as measured on a GPU.
double cuda_attention_vector_efficiency();
// Tessera's fused attention on tensor cores (bf16 and f16): its measured share of the bf16 GEMM
// peak.
double cuda_tensor_core_attention_efficiency();

// The share of an NVLink's line rate (each way) that NCCL's collectives move as bus bandwidth.
double nvlink_nccl_efficiency();

}  // namespace tessera
