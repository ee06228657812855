// The part of NVIDIA's C APIs that Tessera calls (the CUDA driver, NVRTC, cuBLAS, NCCL), declared here
// so the CUDA backend builds on any machine: no toolkit headers, nothing linked. Each library is
// opened at run time (backend/cuda/runtime_library.hpp) and each entry point resolved by the
// symbol these tables name. Types, enumerator values and signatures are those of the public
// cuda.h, nvrtc.h, cublas_api.h and nccl.h, which NVIDIA keeps stable across releases (CUDA 11.2 to 13);
// versioned symbols are named as cuda.h maps them (cuMemcpyHtoDAsync -> cuMemcpyHtoDAsync_v2).
// A call the backend needs that is not here is added here, in one line per function.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera {

// ---- the driver API (libcuda.so.1, installed with the GPU's driver) ----
enum CUresult : int { CUDA_SUCCESS = 0, CUDA_ERROR_NOT_READY = 600 };  // others are named by cuGetErrorName
using CUdevice = int;
using CUdeviceptr = unsigned long long;
inline CUdeviceptr device_pointer(const void* p) { return CUdeviceptr(reinterpret_cast<uintptr_t>(p)); }
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUevent_st;
struct CUmemPoolHandle_st;
struct CUgraph_st;
struct CUgraphExec_st;
using CUcontext = CUctx_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;
using CUmemoryPool = CUmemPoolHandle_st*;
using CUgraph = CUgraph_st*;
using CUgraphExec = CUgraphExec_st*;
// Capture records this thread's calls on the stream; other threads' unsafe calls are not refused.
enum CUstreamCaptureMode : int { CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1 };
enum CUdevice_attribute : int {
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
};
enum CUfunction_attribute : int { CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8 };
enum CUjit_option : int { CU_JIT_ERROR_LOG_BUFFER = 5, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6 };
enum CUmemPool_attribute : int { CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4 };
constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
constexpr unsigned CU_EVENT_DEFAULT = 0x0;
constexpr unsigned CU_EVENT_DISABLE_TIMING = 0x2;

// X(member, symbol, function type). cuEventElapsedTime keeps its first symbol, which every
// driver has (CUDA 12.8's headers map the name to a _v2 that older drivers lack).
#define TESSERA_CUDA_DRIVER_FUNCTIONS(X)                                                                   \
  X(cuInit, "cuInit", CUresult(unsigned))                                                                  \
  X(cuGetErrorName, "cuGetErrorName", CUresult(CUresult, const char**))                                    \
  X(cuGetErrorString, "cuGetErrorString", CUresult(CUresult, const char**))                                \
  X(cuDeviceGetCount, "cuDeviceGetCount", CUresult(int*))                                                  \
  X(cuDeviceGet, "cuDeviceGet", CUresult(CUdevice*, int))                                                  \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute", CUresult(int*, CUdevice_attribute, CUdevice))            \
  X(cuDeviceGetName, "cuDeviceGetName", CUresult(char*, int, CUdevice))                                    \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", CUresult(CUcontext*, CUdevice))                  \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", CUresult(CUcontext))                                               \
  X(cuStreamCreate, "cuStreamCreate", CUresult(CUstream*, unsigned))                                       \
  X(cuStreamSynchronize, "cuStreamSynchronize", CUresult(CUstream))                                        \
  X(cuStreamWaitEvent, "cuStreamWaitEvent", CUresult(CUstream, CUevent, unsigned))                         \
  X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", CUresult(CUmemoryPool*, CUdevice))             \
  X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", CUresult(CUmemoryPool, CUmemPool_attribute, void*))    \
  X(cuMemAllocAsync, "cuMemAllocAsync", CUresult(CUdeviceptr*, size_t, CUstream))                          \
  X(cuMemFreeAsync, "cuMemFreeAsync", CUresult(CUdeviceptr, CUstream))                                     \
  X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", CUresult(CUdeviceptr, const void*, size_t, CUstream))       \
  X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", CUresult(void*, CUdeviceptr, size_t, CUstream))             \
  X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", CUresult(CUdeviceptr, CUdeviceptr, size_t, CUstream))       \
  X(cuMemsetD8Async, "cuMemsetD8Async", CUresult(CUdeviceptr, unsigned char, size_t, CUstream))            \
  X(cuMemsetD16Async, "cuMemsetD16Async", CUresult(CUdeviceptr, unsigned short, size_t, CUstream))         \
  X(cuMemsetD32Async, "cuMemsetD32Async", CUresult(CUdeviceptr, unsigned, size_t, CUstream))               \
  X(cuModuleLoadDataEx, "cuModuleLoadDataEx", CUresult(CUmodule*, const void*, unsigned, CUjit_option*, void**)) \
  X(cuModuleGetFunction, "cuModuleGetFunction", CUresult(CUfunction*, CUmodule, const char*))              \
  X(cuFuncSetAttribute, "cuFuncSetAttribute", CUresult(CUfunction, CUfunction_attribute, int))             \
  X(cuLaunchKernel, "cuLaunchKernel",                                                                      \
    CUresult(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void**, void**)) \
  X(cuEventCreate, "cuEventCreate", CUresult(CUevent*, unsigned))                                          \
  X(cuEventRecord, "cuEventRecord", CUresult(CUevent, CUstream))                                           \
  X(cuEventSynchronize, "cuEventSynchronize", CUresult(CUevent))                                           \
  X(cuEventQuery, "cuEventQuery", CUresult(CUevent))                                                       \
  X(cuEventElapsedTime, "cuEventElapsedTime", CUresult(float*, CUevent, CUevent))                          \
  X(cuEventDestroy, "cuEventDestroy_v2", CUresult(CUevent))                                               \
  X(cuStreamBeginCapture, "cuStreamBeginCapture_v2", CUresult(CUstream, CUstreamCaptureMode))              \
  X(cuStreamEndCapture, "cuStreamEndCapture", CUresult(CUstream, CUgraph*))                                \
  X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", CUresult(CUgraphExec*, CUgraph, unsigned long long)) \
  X(cuGraphLaunch, "cuGraphLaunch", CUresult(CUgraphExec, CUstream))                                       \
  X(cuGraphDestroy, "cuGraphDestroy", CUresult(CUgraph))                                                   \
  X(cuGraphExecDestroy, "cuGraphExecDestroy", CUresult(CUgraphExec))

// ---- NVRTC (libnvrtc.so.<version>, with the toolkit; Debian's libnvrtc11.2 is CUDA 11.8's) ----
enum nvrtcResult : int { NVRTC_SUCCESS = 0, NVRTC_ERROR_INVALID_OPTION = 5 };
struct _nvrtcProgram;
using nvrtcProgram = _nvrtcProgram*;

#define TESSERA_NVRTC_FUNCTIONS(X)                                                                         \
  X(nvrtcGetErrorString, "nvrtcGetErrorString", const char*(nvrtcResult))                                  \
  X(nvrtcVersion, "nvrtcVersion", nvrtcResult(int*, int*))                                                 \
  X(nvrtcGetNumSupportedArchs, "nvrtcGetNumSupportedArchs", nvrtcResult(int*))                             \
  X(nvrtcGetSupportedArchs, "nvrtcGetSupportedArchs", nvrtcResult(int*))                                   \
  X(nvrtcCreateProgram, "nvrtcCreateProgram",                                                              \
    nvrtcResult(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*))     \
  X(nvrtcDestroyProgram, "nvrtcDestroyProgram", nvrtcResult(nvrtcProgram*))                                \
  X(nvrtcCompileProgram, "nvrtcCompileProgram", nvrtcResult(nvrtcProgram, int, const char* const*))        \
  X(nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize", nvrtcResult(nvrtcProgram, size_t*))                  \
  X(nvrtcGetProgramLog, "nvrtcGetProgramLog", nvrtcResult(nvrtcProgram, char*))                            \
  X(nvrtcGetCUBINSize, "nvrtcGetCUBINSize", nvrtcResult(nvrtcProgram, size_t*))                            \
  X(nvrtcGetCUBIN, "nvrtcGetCUBIN", nvrtcResult(nvrtcProgram, char*))                                      \
  X(nvrtcGetPTXSize, "nvrtcGetPTXSize", nvrtcResult(nvrtcProgram, size_t*))                                \
  X(nvrtcGetPTX, "nvrtcGetPTX", nvrtcResult(nvrtcProgram, char*))

// ---- cuBLAS (libcublas.so.<version>, with the toolkit) ----
enum cublasStatus_t : int { CUBLAS_STATUS_SUCCESS = 0 };
struct cublasContext;
using cublasHandle_t = cublasContext*;
using cudaStream_t = CUstream_st*;  // the runtime API's stream is the driver's
enum cublasOperation_t : int { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasMath_t : int { CUBLAS_DEFAULT_MATH = 0 };
enum cudaDataType : int { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16BF = 14 };  // library_types.h's values
enum cublasComputeType_t : int { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_64F = 70 };
enum cublasGemmAlgo_t : int { CUBLAS_GEMM_DEFAULT = -1 };

#define TESSERA_CUBLAS_FUNCTIONS(X)                                                                        \
  X(create, "cublasCreate_v2", cublasStatus_t(cublasHandle_t*))                                            \
  X(set_stream, "cublasSetStream_v2", cublasStatus_t(cublasHandle_t, cudaStream_t))                        \
  X(set_math_mode, "cublasSetMathMode", cublasStatus_t(cublasHandle_t, cublasMath_t))                      \
  X(set_workspace, "cublasSetWorkspace_v2", cublasStatus_t(cublasHandle_t, void*, size_t))                 \
  X(gemm_strided_batched, "cublasGemmStridedBatchedEx",                                                    \
    cublasStatus_t(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,       \
                   const void*, cudaDataType, int, long long, const void*, cudaDataType, int, long long,   \
                   const void*, void*, cudaDataType, int, long long, int, cublasComputeType_t, cublasGemmAlgo_t))

// ---- NCCL (libnccl.so.2, NCCL 2.10 or newer: ncclAvg and ncclBfloat16) ----
// Types and values of NVIDIA/nccl's src/nccl.h.in (NCCL_UNIQUE_ID_BYTES, ncclResult_t,
// ncclRedOp_t, ncclDataType_t), unchanged since 2.10; the enums are C enums, so int-sized.
struct ncclComm;
using ncclComm_t = ncclComm*;
struct ncclUniqueId {
  char internal[128];  // NCCL_UNIQUE_ID_BYTES
};
enum ncclResult_t : int { ncclSuccess = 0, ncclInProgress = 7 };  // others are named by ncclGetErrorString
enum ncclDataType_t : int {
  ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
  ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9,
};
enum ncclRedOp_t : int { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };

#define TESSERA_NCCL_FUNCTIONS(X)                                                                          \
  X(ncclGetVersion, "ncclGetVersion", ncclResult_t(int*))                                                  \
  X(ncclGetErrorString, "ncclGetErrorString", const char*(ncclResult_t))                                   \
  X(ncclGetUniqueId, "ncclGetUniqueId", ncclResult_t(ncclUniqueId*))                                       \
  X(ncclCommInitRank, "ncclCommInitRank", ncclResult_t(ncclComm_t*, int, ncclUniqueId, int))               \
  X(ncclCommDestroy, "ncclCommDestroy", ncclResult_t(ncclComm_t))                                          \
  X(ncclCommAbort, "ncclCommAbort", ncclResult_t(ncclComm_t))                                              \
  X(ncclCommGetAsyncError, "ncclCommGetAsyncError", ncclResult_t(ncclComm_t, ncclResult_t*))               \
  X(ncclAllReduce, "ncclAllReduce",                                                                        \
    ncclResult_t(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t))       \
  X(ncclAllGather, "ncclAllGather", ncclResult_t(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t)) \
  X(ncclReduceScatter, "ncclReduceScatter",                                                                \
    ncclResult_t(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t))       \
  X(ncclBroadcast, "ncclBroadcast",                                                                        \
    ncclResult_t(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))               \
  X(ncclSend, "ncclSend", ncclResult_t(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)) \
  X(ncclRecv, "ncclRecv", ncclResult_t(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))      \
  X(ncclGroupStart, "ncclGroupStart", ncclResult_t())                                                      \
  X(ncclGroupEnd, "ncclGroupEnd", ncclResult_t())

// A table's member: a pointer to the function type.
template <class FunctionType>
using ApiFunction = FunctionType*;
#define TESSERA_DECLARE_API_MEMBER(member, symbol, type) ApiFunction<type> member = nullptr;

}  // namespace tessera
