// A request to an ensemble (inference_server.hpp): InferenceServer::run_ensemble and the
// EnsembleRun that carries the request through the ensemble's graph (ensemble.hpp), step by step,
// each step a request of its own through InferenceServer::find and run; the ensemble's answer is
// made by make_response (inference_response.hpp).
#include "inference_server.hpp"

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "inference_response.hpp"
#include "trace.hpp"

namespace asyncinfer::server {

/// One request to an ensemble (ensemble.hpp): its tensors, the steps still waiting for theirs,
/// and the step requests in flight. Shared by the step requests' completions, which run on their
/// models' completion executors; every change is under `mu_`, and nothing is called under it.
class InferenceServer::EnsembleRun final : public InflightRequest::Handle,
                                           public std::enable_shared_from_this<EnsembleRun> {
 public:
  EnsembleRun(InferenceServer& server, ModelRef model, RequestOptions step_options, std::string id,
              std::vector<std::size_t> selected, Completion done, int depth,
              std::shared_ptr<Trace> trace)
      : server_(server),
        model_(std::move(model)),
        graph_(*model_->ensemble),
        options_(std::move(step_options)),
        id_(std::move(id)),
        selected_(std::move(selected)),
        done_(std::move(done)),
        start_(Clock::now()),
        depth_(depth),
        trace_(std::move(trace)),
        tensors_(graph_.tensors.size()),
        waiting_(graph_.steps.size()) {
    std::lock_guard lock(server_.ensembles_mu_);
    ++server_.live_ensembles_;
  }

  void start(Inputs inputs) {
    std::vector<std::size_t> ready;
    {
      std::lock_guard lock(mu_);
      for (std::size_t i = 0; i < inputs.size(); ++i)
        tensors_[graph_.inputs[i]] = std::move(inputs[i]);
      for (std::size_t j = 0; j < graph_.steps.size(); ++j) {
        waiting_[j] = graph_.steps[j].waits_for;
        if (waiting_[j] == 0) ready.push_back(j);
      }
    }
    launch(ready);
  }

  void cancel() override { end(cancelled_error("the request was cancelled")); }

 private:
  void launch(const std::vector<std::size_t>& ready) {
    for (std::size_t j : ready) {
      const EnsembleGraph::Step& step = graph_.steps[j];
      Result<ModelRef> ref = server_.find(step.model, step.version, model_->model_namespace);
      if (!ref.ok()) return end(ref.status().with_context(step_context(j)));
      // The step model as it is served now (it may have been reloaded since the ensemble
      // loaded): its inputs and outputs are found by name, and must still be what the ensemble
      // was checked against.
      const ModelSignature& sig = (*ref)->signature;
      Status fits = sig.decoupled
                        ? failed_precondition_error("model '" + step.model + "' is now decoupled")
                        : step_fits(step, sig);
      if (!fits.ok()) return end(fits.with_context(step_context(j)));
      if ((*ref)->ensemble && depth_ + 1 >= kMaxEnsembleNesting) {
        return end(failed_precondition_error(
            "ensembles nest more than " + std::to_string(kMaxEnsembleNesting) +
            " deep (a cycle through ensembles reloaded since they loaded?)"));
      }
      Inputs inputs(sig.inputs.size());
      {
        std::lock_guard lock(mu_);
        if (ended_) return;
        for (std::size_t k = 0; k < step.inputs.size(); ++k) {
          inputs[index_of(sig.inputs, step.input_names[k])] = tensors_[step.inputs[k]];  // shared
        }
      }
      auto self = shared_from_this();
      Completion done = [self, j](Result<InferResponse> out) {
        self->step_done(j, std::move(out));
      };
      const RequestOptions* options = &options_;
      std::optional<RequestOptions> traced;  // made only for a traced request
      if (trace_) [[unlikely]] {
        // A traced ensemble request: each step a child trace of the ensemble's, as Triton's
        // ensemble scheduler spawns them.
        traced.emplace(options_);
        done = trace_request(Trace::child_of(trace_), **ref, id_, inputs, *traced, std::move(done));
        options = &*traced;
      }
      Result<InflightRequest> call =
          (*ref)->ensemble
              ? server_.run_ensemble(std::move(*ref), std::move(inputs), *options, id_, {},
                                     std::move(done), depth_ + 1)
              : server_.run(std::move(*ref), std::move(inputs), *options, id_, {}, std::move(done));
      if (!call.ok()) return end(call.status().with_context(step_context(j)));
      bool cancel_now = false;
      {
        std::lock_guard lock(mu_);
        if (!first_step_) first_step_ = Clock::now();
        cancel_now = ended_;
        if (!ended_ && !finished_[j]) inflight_.emplace_back(j, std::move(*call));
      }
      if (cancel_now) call->cancel();
    }
  }

  static std::size_t index_of(const std::vector<TensorSpec>& specs, const std::string& name) {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].name == name) return i;
    }
    return specs.size();
  }

  /// Whether `sig` still has the inputs and outputs the step was resolved with: every input
  /// mapped (and no other), every mapped output, with the same dtypes.
  static Status step_fits(const EnsembleGraph::Step& step, const ModelSignature& sig) {
    auto stale = [&](const std::string& what) {
      return failed_precondition_error("model '" + step.model + "' was reloaded with " + what +
                                       " since the ensemble loaded (reload the ensemble)");
    };
    if (sig.inputs.size() != step.input_names.size()) return stale("other inputs");
    for (std::size_t k = 0; k < step.input_names.size(); ++k) {
      const std::size_t i = index_of(sig.inputs, step.input_names[k]);
      if (i == sig.inputs.size()) return stale("no input '" + step.input_names[k] + "'");
      if (sig.inputs[i].dtype != step.input_dtypes[k]) {
        return stale("another dtype for input '" + step.input_names[k] + "'");
      }
    }
    for (std::size_t k = 0; k < step.output_names.size(); ++k) {
      const std::size_t i = index_of(sig.outputs, step.output_names[k]);
      if (i == sig.outputs.size()) return stale("no output '" + step.output_names[k] + "'");
      if (sig.outputs[i].dtype != step.output_dtypes[k]) {
        return stale("another dtype for output '" + step.output_names[k] + "'");
      }
    }
    return Status();
  }

  void step_done(std::size_t j, Result<InferResponse> out) {
    if (!out.ok()) return end(out.status().with_context(step_context(j)));
    std::vector<std::size_t> ready;
    Outputs outputs;
    bool last = false;
    std::uint64_t queued = 0;  // the ensemble's own queue time (EnsembleCounters)
    {
      std::lock_guard lock(mu_);
      if (ended_) return;
      finished_[j] = true;
      std::erase_if(inflight_, [j](const auto& p) { return p.first == j; });
      const EnsembleGraph::Step& step = graph_.steps[j];
      // By name: the outputs of the version that ran (step_fits checked they are all there).
      for (InferOutput& o : out->outputs) {
        for (std::size_t k = 0; k < step.output_names.size(); ++k) {
          if (o.spec->name == step.output_names[k]) {
            tensors_[step.outputs[k]] = std::move(o.tensor);
          }
        }
      }
      for (const auto& [consumer, count] : step.feeds) {
        waiting_[consumer] -= count;
        if (waiting_[consumer] == 0) ready.push_back(consumer);
      }
      if (++steps_done_ == graph_.steps.size()) {
        last = true;
        ended_ = true;
        queued = first_step_ ? ns_between(start_, *first_step_) : 0;
        outputs.reserve(graph_.outputs.size());
        for (std::size_t t : graph_.outputs) outputs.push_back(tensors_[t]);
      }
    }
    if (last) {
      model_->ensemble_counters->record(true, ns_since(start_), rows_of(outputs), queued);
      Completion done = std::move(done_);
      done(make_response(model_, id_, selected_, outputs));
      return ended();
    }
    launch(ready);
  }

  /// Ends the request with `s` (once): the steps in flight are cancelled, none is started.
  void end(Status s) {
    std::vector<std::pair<std::size_t, InflightRequest>> calls;
    Completion done;
    {
      std::lock_guard lock(mu_);
      if (ended_) return;
      ended_ = true;
      calls.swap(inflight_);
      done = std::move(done_);
    }
    for (auto& [j, call] : calls) call.cancel();
    model_->ensemble_counters->record(false, ns_since(start_), 0, 0);
    // Triton's wording (ensemble_scheduler.cc): the step's error after "in ensemble 'E', ".
    done(Status(s.code(), "in ensemble '" + model_->model_name + "', " + std::string(s.message())));
    ended();
  }

  /// The request has been answered (once, by step_done or end): a draining shutdown need not
  /// wait for it any more, whoever still holds this object.
  void ended() {
    std::lock_guard lock(server_.ensembles_mu_);
    if (--server_.live_ensembles_ == 0) server_.ensembles_cv_.notify_all();
  }

  std::string step_context(std::size_t j) const { return graph_.steps[j].label; }
  std::uint64_t rows_of(const Outputs& outputs) const {
    if (!model_->signature.batched || outputs.empty() || outputs[0].rank() == 0) return 1;
    return static_cast<std::uint64_t>(outputs[0].shape()[0]);
  }

  InferenceServer& server_;
  const ModelRef model_;
  const EnsembleGraph& graph_;  // owned by model_
  const RequestOptions options_;
  const std::string id_;
  const std::vector<std::size_t> selected_;
  Completion done_;
  const Clock::time_point start_;
  const int depth_;
  const std::shared_ptr<Trace> trace_;  // the request's trace, when traced: the steps' parent
  std::mutex mu_;
  std::vector<Tensor> tensors_;       // by tensor index; under mu_
  std::vector<std::size_t> waiting_;  // per step: inputs not made yet; under mu_
  std::vector<bool> finished_ = std::vector<bool>(graph_.steps.size(), false);  // under mu_
  std::vector<std::pair<std::size_t, InflightRequest>> inflight_;               // under mu_
  std::size_t steps_done_ = 0;                                                  // under mu_
  bool ended_ = false;                                                          // under mu_
  std::optional<Clock::time_point> first_step_;  // when the first step was handed over; under mu_
};

Result<InflightRequest> InferenceServer::run_ensemble(ModelRef model, Inputs inputs,
                                                      const RequestOptions& options, std::string id,
                                                      std::vector<std::size_t> selected,
                                                      Completion done, int depth) {
  ASYNCINFER_RETURN_IF_ERROR(validate_inputs(model->signature, inputs)
                                 .with_context("ensemble '" + model->model_name + "'"));
  // One deadline for every step: the request's, however long the steps before took.
  RequestOptions steps = options;
  if (options.timeout && *options.timeout != std::chrono::microseconds::max()) {
    const Clock::time_point by = detail::saturating_add(Clock::now(), *options.timeout);
    steps.deadline = options.deadline ? std::min(*options.deadline, by) : by;
  }
  steps.timeout.reset();
  // A step's completion submits the next steps, or ends the ensemble with `done`: on the thread
  // that ended the step where the caller lets `done` run on such a thread (it only hands the
  // response over: completion_hands_off), one wake-up of the completion executor fewer a step.
  steps.inline_callback = options.inline_callback;
  steps.caller_run_max_compute = std::chrono::microseconds(0);  // each on its engine's workers
  steps.on_response = nullptr;
  // A traced request (trace_request gave it the trace in its context): the ensemble's own
  // QUEUE_START now, as Triton's ensemble scheduler records it; the steps get traces of their own.
  std::shared_ptr<Trace> trace;
  if (options.timeline) [[unlikely]] {
    options.timeline->queue_start_ns.store(trace_ns(Clock::now()), std::memory_order_relaxed);
    if (options.context) trace = Trace::of(options.context->trace);
  }
  steps.timeline.reset();
  auto run =
      std::make_shared<EnsembleRun>(*this, std::move(model), std::move(steps), std::move(id),
                                    std::move(selected), std::move(done), depth, std::move(trace));
  run->start(std::move(inputs));
  return InflightRequest(std::shared_ptr<InflightRequest::Handle>(std::move(run)));
}

}  // namespace asyncinfer::server
