// builtin:gemm?m=&n=&k=&dtype=f32|f16|bf16&max_batch_size= — a batched GEMM on cuBLAS whose cost
// the user chooses (2·m·n·k·batch floating-point operations per call), for measuring the engine on
// a real GPU.
//
// Signature: input "a" dtype[-1, m, k], output "c" dtype[-1, m, n]; c[b] = a[b] · B with one fixed
// weight B[k, n] (row-major) shared by every item. B is initialised at instance creation on the
// device by a kernel on the instance's stream, from gemm_weight_value(kGemmWeightSeed, i)
// (gemm_weights.hpp): deterministic, and exact in every dtype.
//
// Each call is one cublasGemmStridedBatchedEx on the instance's stream (cublasSetStream on the
// instance's handle), accumulating in fp32 (CUBLAS_COMPUTE_32F; no TF32 for f32 since the handle
// keeps CUBLAS_DEFAULT_MATH). cuBLAS is column-major, so the row-major product c = a·B is computed
// as its transpose cᵀ = Bᵀ·aᵀ, which needs no transposition of the data: B with stride 0 (shared),
// a and c with the per-item strides m·k and m·n.
//
// cuBLAS handles are taken from a per-process pool and never destroyed: cublasDestroy implicitly
// synchronises the whole device, which could wait for other streams' work (or deadlock against a
// host function that waits on this thread); PyTorch keeps its handles for the same reason.
// Errors: bad parameters -> invalid_argument naming the key and the accepted values; an instance
// on a non-cuda device -> unavailable; cuBLAS failures -> internal (resource_exhausted for
// CUBLAS_STATUS_ALLOC_FAILED), naming the call.
#include <cublas_v2.h>

#include <climits>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "core/params.hpp"
#include "device/cuda/cuda_common.hpp"
#include "model/backend.hpp"
#include "model/cuda/gemm_kernels.hpp"
#include "model/cuda/gemm_weights.hpp"

namespace asyncinfer::detail {
namespace {

struct GemmConfig {
  std::int64_t m = 256;
  std::int64_t n = 256;
  std::int64_t k = 256;
  DType dtype = DType::f32;
  std::int64_t max_batch_size = 64;  // the URI key, >= 1: ModelSignature::batch_limit
};

Status cublas_status(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status();
  std::string_view where(file);
  const std::size_t slash = where.rfind('/');
  if (slash != std::string_view::npos) where.remove_prefix(slash + 1);
  const char* name = cublasGetStatusName(s);
  const char* text = cublasGetStatusString(s);
  return Status(
      s == CUBLAS_STATUS_ALLOC_FAILED ? StatusCode::resource_exhausted : StatusCode::internal,
      std::string(call) + " failed at " + std::string(where) + ":" + std::to_string(line) + ": " +
          (name != nullptr ? name : "cublasStatus?") + ": " +
          (text != nullptr ? text : "unknown cuBLAS error"));
}

#define ASYNCINFER_CUBLAS_RETURN_IF_ERROR(call) \
  ASYNCINFER_RETURN_IF_ERROR(cublas_status((call), #call, __FILE__, __LINE__))

cudaDataType cuda_type(DType d) {
  switch (d) {
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

GemmElem gemm_elem(DType d) {
  switch (d) {
    case DType::f16:
      return GemmElem::f16;
    case DType::bf16:
      return GemmElem::bf16;
    default:
      return GemmElem::f32;
  }
}

/// cuBLAS handles per device ordinal, reused by later instances and kept until process exit.
class HandlePool {
 public:
  static HandlePool& instance() {
    static auto* pool = new HandlePool();  // never destroyed: see the header comment
    return *pool;
  }
  /// A handle for the calling thread's current device, which must be `ordinal`.
  Result<cublasHandle_t> acquire(int ordinal) {
    {
      std::lock_guard lock(mu_);
      auto& list = free_[ordinal];
      if (!list.empty()) {
        cublasHandle_t h = list.back();
        list.pop_back();
        return h;
      }
    }
    cublasHandle_t h = nullptr;
    ASYNCINFER_CUBLAS_RETURN_IF_ERROR(cublasCreate(&h));
    return h;
  }
  void give_back(int ordinal, cublasHandle_t h) {
    std::lock_guard lock(mu_);
    free_[ordinal].push_back(h);
  }

 private:
  std::mutex mu_;
  std::map<int, std::vector<cublasHandle_t>> free_;
};

class GemmModel final : public Model, public std::enable_shared_from_this<GemmModel> {
 public:
  GemmModel(std::string name, GemmConfig cfg) : name_(std::move(name)), cfg_(cfg) {
    sig_.batched = true;
    sig_.batch_limit = cfg_.max_batch_size;
    sig_.inputs.push_back(TensorSpec{"a", cfg_.dtype, {-1, cfg_.m, cfg_.k}});
    sig_.outputs.push_back(TensorSpec{"c", cfg_.dtype, {-1, cfg_.m, cfg_.n}});
  }

  const ModelSignature& signature() const noexcept override { return sig_; }
  const std::string& name() const noexcept override { return name_; }
  bool cancellable() const noexcept override { return false; }  // a cuBLAS call runs to the end

  Result<std::unique_ptr<ModelInstance>> create_instance(Device& device, Stream& stream,
                                                         const InstanceOptions& options) override;

  const GemmConfig& config() const noexcept { return cfg_; }

 private:
  std::string name_;
  GemmConfig cfg_;
  ModelSignature sig_;
};

class GemmInstance final : public ModelInstance {
 public:
  GemmInstance(std::shared_ptr<GemmModel> model, Device& device, Stream& stream, int ordinal,
               cublasHandle_t handle, std::shared_ptr<Storage> weight, cudaEvent_t last)
      : model_(std::move(model)),
        device_(device),
        stream_(stream),
        ordinal_(ordinal),
        handle_(handle),
        weight_(std::move(weight)),
        last_(last) {}

  ~GemmInstance() override {
    // The weight and the handle may be reused only once the last call on the stream is done.
    CudaDeviceGuard guard(ordinal_);
    (void)ASYNCINFER_CUDA_STATUS(cudaEventSynchronize(last_));
    (void)ASYNCINFER_CUDA_STATUS(cudaEventDestroy(last_));
    HandlePool::instance().give_back(ordinal_, handle_);
    weight_.reset();
  }
  GemmInstance(const GemmInstance&) = delete;
  GemmInstance& operator=(const GemmInstance&) = delete;

  Status enqueue(Stream& stream, const std::shared_ptr<BatchIO>& io) override {
    const GemmConfig& cfg = model_->config();
    if (&stream != &stream_) {
      return invalid_argument_error(
          model_->name() + ": enqueue on another stream than the instance was created for");
    }
    if (io->inputs.size() != 1) {
      return invalid_argument_error(model_->name() + ": expected 1 input (a), got " +
                                    std::to_string(io->inputs.size()));
    }
    const Tensor& a = io->inputs[0];
    const std::string expected = std::string(to_string(cfg.dtype)) + "[-1," +
                                 std::to_string(cfg.m) + "," + std::to_string(cfg.k) + "]";
    if (!a.defined() || a.dtype() != cfg.dtype || a.rank() != 3 || a.dim(1) != cfg.m ||
        a.dim(2) != cfg.k) {
      return invalid_argument_error(model_->name() + ": input 'a' must be " + expected + ", got " +
                                    (a.defined() ? a.describe() : std::string("undefined")));
    }
    if (a.placement().kind != MemoryKind::device || a.placement().device_id != ordinal_ ||
        a.is_host_accessible()) {
      return invalid_argument_error(
          model_->name() + ": input 'a' must be in the memory of cuda:" + std::to_string(ordinal_) +
          ", got " + std::string(to_string(a.placement().kind)) + " memory");
    }
    const std::int64_t batch = a.dim(0);
    if (batch > INT_MAX) {
      return invalid_argument_error(model_->name() + ": batch of " + std::to_string(batch) +
                                    " exceeds cuBLAS's batch count limit");
    }
    ASYNCINFER_ASSIGN_OR_RETURN(
        Tensor c, device_.empty(cfg.dtype, {batch, cfg.m, cfg.n}, MemoryKind::device));
    io->outputs.clear();
    io->outputs.push_back(c);
    if (batch == 0) return Status();

    CudaDeviceGuard guard(ordinal_);
    ASYNCINFER_RETURN_IF_ERROR(guard.status());
    const float alpha = 1.0f;
    const float beta = 0.0f;
    const cudaDataType type = cuda_type(cfg.dtype);
    const int m = static_cast<int>(cfg.m);
    const int n = static_cast<int>(cfg.n);
    const int k = static_cast<int>(cfg.k);
    // Column-major view: cᵀ[n×m] = Bᵀ[n×k] · aᵀ[k×m] for each item.
    ASYNCINFER_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
        handle_, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, weight_->data(), type, n, 0LL, a.data(),
        type, k, static_cast<long long>(cfg.m * cfg.k), &beta, c.data(), type, n,
        static_cast<long long>(cfg.m * cfg.n), static_cast<int>(batch), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
    ASYNCINFER_CUDA_RETURN_IF_ERROR(cudaEventRecord(last_, native(stream_)));
    return Status();
  }

  static cudaStream_t native(Stream& s) { return static_cast<cudaStream_t>(s.native_handle()); }

 private:
  std::shared_ptr<GemmModel> model_;
  Device& device_;
  Stream& stream_;
  const int ordinal_;
  cublasHandle_t handle_;
  std::shared_ptr<Storage> weight_;
  cudaEvent_t last_;  // recorded after every call: the destructor waits for it
};

Result<std::unique_ptr<ModelInstance>> GemmModel::create_instance(
    Device& device, Stream& stream, const InstanceOptions& /*options*/) {
  auto ordinal = cuda_device_ordinal(device);
  if (!ordinal.ok()) {
    return unavailable_error(name_ + ": builtin:gemm needs a cuda device (cuBLAS), but '" +
                             device.name() + "' is a " + std::string(to_string(device.kind())) +
                             " device; open cuda or cuda:<index>");
  }
  if (&stream.device() != &device) {
    return invalid_argument_error(name_ + ": the stream belongs to device '" +
                                  stream.device().name() + "', not '" + device.name() + "'");
  }
  const int ord = *ordinal;
  CudaDeviceGuard guard(ord);
  ASYNCINFER_RETURN_IF_ERROR(guard.status());
  Status loaded = ASYNCINFER_CUDA_STATUS(preload_gemm_kernels());
  if (!loaded.ok()) {
    // Typically no machine code or PTX for this GPU in the build (ASYNCINFER_CUDA_ARCHITECTURES).
    return Status(StatusCode::unavailable, loaded.message()).with_context(name_);
  }
  const std::size_t elems = static_cast<std::size_t>(cfg_.k * cfg_.n);
  ASYNCINFER_ASSIGN_OR_RETURN(auto weight,
                              device.allocate(elems * dtype_size(cfg_.dtype), MemoryKind::device));
  const cudaStream_t s = GemmInstance::native(stream);
  cudaEvent_t last = nullptr;
  ASYNCINFER_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&last, cudaEventBlockingSync | cudaEventDisableTiming));
  cublasHandle_t handle = nullptr;
  auto h = HandlePool::instance().acquire(ord);
  Status st = h.status();
  if (h.ok()) handle = *h;
  if (st.ok())
    st = cublas_status(cublasSetStream(handle, s), "cublasSetStream", __FILE__, __LINE__);
  if (st.ok()) {
    st = cublas_status(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode",
                       __FILE__, __LINE__);
  }
  bool launched = false;
  if (st.ok()) {
    st = ASYNCINFER_CUDA_STATUS(
        launch_gemm_weight_init(s, weight->data(), elems, gemm_elem(cfg_.dtype), kGemmWeightSeed));
    launched = st.ok();
  }
  if (st.ok()) st = ASYNCINFER_CUDA_STATUS(cudaEventRecord(last, s));
  if (!st.ok()) {
    // The initialiser may still be writing the weight: let it finish before the weight is freed.
    if (launched) (void)cudaStreamSynchronize(s);
    (void)cudaEventDestroy(last);
    if (handle != nullptr) HandlePool::instance().give_back(ord, handle);
    return st.with_context(name_);
  }
  return std::unique_ptr<ModelInstance>(std::make_unique<GemmInstance>(
      shared_from_this(), device, stream, ord, handle, std::move(weight), last));
}

}  // namespace

Result<std::shared_ptr<Model>> load_gemm_model(std::string_view /*uri*/, std::string_view query,
                                               const ModelOptions& /*options*/) {
  const std::string context = "builtin:gemm";
  ASYNCINFER_ASSIGN_OR_RETURN(Params p, Params::parse(query, '&', context));
  ASYNCINFER_RETURN_IF_ERROR(p.accept_alias("max_batch", "max_batch_size"));
  ASYNCINFER_RETURN_IF_ERROR(p.check_known({"m", "n", "k", "dtype", "max_batch_size"}));
  GemmConfig cfg;
  constexpr std::int64_t kMaxDim = 65536;
  ASYNCINFER_ASSIGN_OR_RETURN(cfg.m, p.get_int("m", cfg.m, 1, kMaxDim));
  ASYNCINFER_ASSIGN_OR_RETURN(cfg.n, p.get_int("n", cfg.n, 1, kMaxDim));
  ASYNCINFER_ASSIGN_OR_RETURN(cfg.k, p.get_int("k", cfg.k, 1, kMaxDim));
  ASYNCINFER_ASSIGN_OR_RETURN(cfg.max_batch_size,
                              p.get_int("max_batch_size", cfg.max_batch_size, 1, 1 << 20));
  ASYNCINFER_ASSIGN_OR_RETURN(std::string dtype, p.get_string("dtype", "f32"));
  auto parsed = parse_dtype(dtype);
  if (!parsed.ok() || (*parsed != DType::f32 && *parsed != DType::f16 && *parsed != DType::bf16)) {
    return invalid_argument_error(context + ": dtype=" + dtype + " is not one of f32, f16, bf16");
  }
  cfg.dtype = *parsed;
  return std::shared_ptr<Model>(std::make_shared<GemmModel>(
      "builtin:gemm" + std::string(query.empty() ? "" : "?") + std::string(query), cfg));
}

void register_gemm_model_backend(ModelBackendRegistry& registry) {
  (void)registry.add({"builtin:gemm", "builtin:gemm?m=&n=&k=&dtype=... (cuda)", &load_gemm_model});
}

}  // namespace asyncinfer::detail
