// A scriptable model for engine tests: records every call (time, instance, the first element of
// each item) and lets the test decide, per call, to fail, to take time, or both.
#pragma once

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <vector>

#include "asyncinfer/model.hpp"

namespace asyncinfer::testing {

struct Call {
  Clock::time_point at;
  int instance;
  std::int64_t index;         ///< global call number, from 1
  std::vector<float> firsts;  ///< first element of each item of the batch
  std::int64_t cols = 0;      ///< dim 1 of the batch
};

/// What a call does: return an error to fail it (in stream order), ok to succeed; `delay` is
/// how long the stream is busy first.
struct Decision {
  Status status;
  std::chrono::microseconds delay{0};
};

class ScriptedModel final : public Model, public std::enable_shared_from_this<ScriptedModel> {
 public:
  using Script = std::function<Decision(const Call&)>;

  explicit ScriptedModel(Script script, std::int64_t max_batch = 64) : script_(std::move(script)) {
    sig_.batched = true;
    sig_.max_batch_size = max_batch;
    sig_.inputs.push_back({"x", DType::f32, {-1, -1}});
    sig_.outputs.push_back({"y", DType::f32, {-1, -1}});
  }

  const ModelSignature& signature() const noexcept override { return sig_; }
  const std::string& name() const noexcept override { return name_; }
  bool cancellable() const noexcept override { return true; }

  Result<std::unique_ptr<ModelInstance>> create_instance(Device&, Stream&,
                                                         const InstanceOptions& o) override {
    return std::unique_ptr<ModelInstance>(
        std::make_unique<Instance>(shared_from_this(), next_instance_++, o.worker_index));
  }

  std::vector<Call> calls() const {
    std::lock_guard lock(mu_);
    return calls_;
  }
  int instances_created() const { return next_instance_.load(); }

 private:
  class Instance final : public ModelInstance {
   public:
    Instance(std::shared_ptr<ScriptedModel> m, int id, int worker)
        : model_(std::move(m)), id_(id), worker_(worker) {}
    Status enqueue(Stream& stream, const std::shared_ptr<BatchIO>& io) override {
      Call call;
      call.at = Clock::now();
      call.instance = worker_;
      const Tensor& in = io->host_inputs.at(0);
      const std::int64_t rows = in.dim(0);
      const std::int64_t cols = rows == 0 ? 0 : static_cast<std::int64_t>(in.numel()) / rows;
      for (std::int64_t r = 0; r < rows; ++r) call.firsts.push_back(in.data_as<float>()[r * cols]);
      call.cols = cols;
      {
        std::lock_guard lock(model_->mu_);
        call.index = static_cast<std::int64_t>(model_->calls_.size()) + 1;
        model_->calls_.push_back(call);
      }
      const Decision d = model_->script_(call);
      auto out = Tensor::empty(DType::f32, in.shape());
      if (!out.ok()) return out.status();
      io->outputs = {*out};
      Kernel k;
      k.name = "scripted";
      k.duration = d.delay;
      k.stop = io->stop;
      k.host_fn = [io, d](std::stop_token) {
        if (!d.status.ok()) return d.status;
        std::memcpy(io->outputs[0].data(), io->inputs[0].data(), io->inputs[0].byte_size());
        return Status();
      };
      return stream.enqueue(std::move(k));
    }

   private:
    std::shared_ptr<ScriptedModel> model_;
    int id_;
    int worker_;
  };

  Script script_;
  ModelSignature sig_;
  std::string name_ = "scripted";
  std::atomic<int> next_instance_{0};
  mutable std::mutex mu_;
  std::vector<Call> calls_;
};

}  // namespace asyncinfer::testing
