// context.cu — the per-device CUDA context (context.cuh): cuBLAS and cuBLASLt handles, one workspace for
// both, persistent scratch buffers; the cuBLAS error texts and hints of SL_CUBLAS_CHECK (cuda_check.h);
// require_bf16_support (twins.h).
// Memory: the workspace and the scratch buffers come from the CUDA Allocator (category Workspace), so
// they are counted and the simulated memory cap applies to them. They are never freed: a context
// lives until the process exits (destroying cuBLAS handles from a static destructor can run after
// the CUDA runtime has shut down, a known crash at exit), so its bytes stay in the Workspace count.
// Tests: tests/common/ops/test_ops_cuda.cpp
#include <cstdio>
#include <mutex>

#include "context.cuh"
#include "scalelab/core/allocator.h"  // defines: Allocator, MemCategory::Workspace
#include "scalelab/ops/twins.h"       // defines: the declarations of require_bf16_support, synchronize

namespace scalelab::cuda {

namespace {
// cuBLASLt's recommendation for Hopper (NVIDIA's cuBLASLt docs; llm.c uses the same): enough for every
// algorithm of the GEMM shapes here. cuBLAS (GemmEx) is given the same buffer instead of its own pool.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // bytes (32 MiB)
constexpr int kMaxDevices = 64;
constexpr size_t kMinScratchBytes = size_t{4} << 10;  // bytes (4 KiB): smallest scratch allocation

std::mutex g_mutex;                           // guards g_contexts (creation only)
DeviceContext* g_contexts[kMaxDevices] = {};  // created on first use, never deleted (file head)

const char* cublas_status_name(int status) {
  switch (static_cast<cublasStatus_t>(status)) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_<unknown>";
  }
}
}  // namespace

int current_device() {
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();  // we are already reporting an error; do not let this one linger
    return -1;
  }
  return dev;
}

std::string cublas_status_message(int status) {
  return detail::format("cuBLAS error %s (%s) on dev %d", cublas_status_name(status),
                        cublasGetStatusString(static_cast<cublasStatus_t>(status)), current_device());
}

const char* cublas_status_hint(int status) {
  switch (static_cast<cublasStatus_t>(status)) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "cuBLAS could not start: check the driver with nvidia-smi and that CUDA_VISIBLE_DEVICES shows a GPU";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the GPU is out of memory: use a smaller batch or model";
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "this GPU or cuBLAS lacks the requested type or algorithm (bf16 needs compute capability 8.0+); "
             "try --precision fp32";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "a GPU kernel failed: rerun with SL_SYNC_LAUNCH=1 (an earlier launch may be the cause) or under "
             "compute-sanitizer";
    default:
      return "rerun with CUBLASLT_LOG_LEVEL=5 CUBLAS_LOGINFO_DBG=1 CUBLAS_LOGDEST_DBG=stderr to see cuBLAS's own "
             "account, and SL_SYNC_LAUNCH=1 to rule out an earlier kernel";
  }
}

DeviceContext& context() {
  int dev = 0;
  SL_CUDA_CHECK(cudaGetDevice(&dev));
  SL_CHECK(dev >= 0 && dev < kMaxDevices, "CUDA device %d is outside [0, %d): raise kMaxDevices in context.cu", dev,
           kMaxDevices);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_contexts[dev] != nullptr) return *g_contexts[dev];

  auto* ctx = new DeviceContext;
  ctx->device = dev;
  Allocator& alloc = Allocator::get(Device::CUDA);
  try {
    cudaDeviceProp prop{};
    SL_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    ctx->cc_major = prop.major;
    ctx->cc_minor = prop.minor;
    std::snprintf(ctx->name, sizeof ctx->name, "%s", prop.name);
    // The workspace before the handles: under a memory cap it is the step that can fail (OutOfMemory).
    ctx->workspace = alloc.allocate(kWorkspaceBytes, MemCategory::Workspace);
    ctx->workspace_bytes = kWorkspaceBytes;
    SL_CUBLAS_CHECK(cublasCreate(&ctx->cublas));
    SL_CUBLAS_CHECK(cublasSetStream(ctx->cublas, kDefaultStream));
    SL_CUBLAS_CHECK(cublasSetWorkspace(ctx->cublas, ctx->workspace, ctx->workspace_bytes));
    SL_CUBLAS_CHECK(cublasLtCreate(&ctx->cublaslt));
  } catch (...) {
    if (ctx->cublas != nullptr) (void)cublasDestroy(ctx->cublas);
    if (ctx->workspace != nullptr) alloc.deallocate(ctx->workspace, ctx->workspace_bytes, MemCategory::Workspace);
    delete ctx;
    throw;
  }
  g_contexts[dev] = ctx;
  return *ctx;
}

void* scratch(Scratch slot, size_t nbytes) {
  DeviceContext& ctx = context();
  const int s = static_cast<int>(slot);
  if (ctx.scratch_bytes[s] >= nbytes && ctx.scratch[s] != nullptr) return ctx.scratch[s];
  // Grow to the next power of two (so a slowly growing need reallocates O(log n) times). Kernels queued
  // earlier may still read the old buffer: wait for them before giving it back.
  size_t bytes = kMinScratchBytes;
  while (bytes < nbytes) bytes *= 2;
  Allocator& alloc = Allocator::get(Device::CUDA);
  if (ctx.scratch[s] != nullptr) {
    SL_CUDA_CHECK(cudaDeviceSynchronize());
    alloc.deallocate(ctx.scratch[s], ctx.scratch_bytes[s], MemCategory::Workspace);
    ctx.scratch[s] = nullptr;
    ctx.scratch_bytes[s] = 0;
  }
  ctx.scratch[s] = alloc.allocate(bytes, MemCategory::Workspace);
  ctx.scratch_bytes[s] = bytes;
  return ctx.scratch[s];
}

void require_bf16_support() {
  const DeviceContext& ctx = context();
  SL_CHECK_HINT(ctx.cc_major >= 8,
                "use --precision fp32 on this GPU (built with -DCMAKE_CUDA_ARCHITECTURES=75 the fp32 path runs on "
                "sm_75), or a GPU with compute capability 8.0+ (A100, RTX 30xx/40xx, H100/H200)",
                "bf16 matmuls need bf16 tensor cores (compute capability 8.0 or newer); device %d (%s) is sm_%d%d",
                ctx.device, ctx.name, ctx.cc_major, ctx.cc_minor);
}

}  // namespace scalelab::cuda
