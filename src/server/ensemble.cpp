// EnsembleGraph (ensemble.hpp): an ensemble's steps resolved against its step models.
#include "ensemble.hpp"

#include <algorithm>
#include <chrono>
#include <map>

namespace asyncinfer::server {

namespace {

Status bad_ensemble(const ModelPlan& plan, const std::string& what) {
  return invalid_argument_error("ensemble '" + plan.name + "': " + what);
}

std::string describe(const TensorSpec& s) {
  return std::string(oip_datatype(s.dtype)) + shape_to_string(s.shape);
}

// Same rank, and every dim equal where neither is -1.
bool compatible(const TensorSpec& a, const TensorSpec& b) {
  if (a.dtype != b.dtype || a.shape.size() != b.shape.size()) return false;
  for (std::size_t d = 0; d < a.shape.size(); ++d) {
    if (a.shape[d] >= 0 && b.shape[d] >= 0 && a.shape[d] != b.shape[d]) return false;
  }
  return true;
}

}  // namespace

Result<std::shared_ptr<const EnsembleGraph>> resolve_ensemble(
    const ModelPlan& plan,
    const std::function<Result<ModelSignature>(const EnsembleStep&)>& signature_of) {
  auto g = std::make_shared<EnsembleGraph>();
  std::map<std::string, std::size_t, std::less<>> ids;
  auto id_of = [&](const std::string& name) {
    auto [it, fresh] = ids.emplace(name, g->tensors.size());
    if (fresh) g->tensors.push_back(name);
    return it->second;
  };
  // Each tensor's producer: its spec and who it is ("the ensemble's input 'x'", "step 1 ...").
  struct Made {
    TensorSpec spec;
    std::string by;
    long step = -1;
  };
  std::map<std::size_t, Made> made;
  for (const TensorSpec& in : plan.inputs) {
    const std::size_t id = id_of(in.name);
    g->inputs.push_back(id);
    made[id] = {in, "the ensemble's input '" + in.name + "'", -1};
  }
  std::vector<ModelSignature> sigs;
  for (std::size_t i = 0; i < plan.ensemble_steps.size(); ++i) {
    const EnsembleStep& s = plan.ensemble_steps[i];
    Result<ModelSignature> sig = signature_of(s);
    if (!sig.ok()) {
      return Status(sig.status().code(), "ensemble '" + plan.name + "': " + s.label(i) + ": " +
                                             std::string(sig.status().message()));
    }
    if (sig->decoupled) {
      return bad_ensemble(plan, s.label(i) +
                                    " is decoupled; ensembles of decoupled models are "
                                    "not supported");
    }
    EnsembleGraph::Step step;
    step.label = s.label(i);
    step.model = s.model_name;
    step.version = s.model_version > 0 ? std::to_string(s.model_version) : std::string();
    if (plan.max_batch_size > 0 && sig->batched && sig->batch_limit &&
        plan.max_batch_size > *sig->batch_limit) {
      return bad_ensemble(plan, "max_batch_size " + std::to_string(plan.max_batch_size) +
                                    " is above " + step.label + "'s " +
                                    std::to_string(*sig->batch_limit));
    }
    for (const auto& [output, tensor] : s.output_map) {
      auto it = std::find_if(sig->outputs.begin(), sig->outputs.end(),
                             [&](const TensorSpec& t) { return t.name == output; });
      if (it == sig->outputs.end()) {
        std::string names;
        for (const TensorSpec& t : sig->outputs) names += (names.empty() ? "" : ", ") + t.name;
        return bad_ensemble(plan, step.label + " output_map names output '" + output +
                                      "', which the model does not have (it has " + names + ")");
      }
      const std::size_t id = id_of(tensor);
      step.output_names.push_back(output);
      step.output_dtypes.push_back(it->dtype);
      step.outputs.push_back(id);
      made[id] = {*it, step.label + " output '" + output + "'", static_cast<long>(i)};
    }
    g->steps.push_back(std::move(step));
    sigs.push_back(std::move(*sig));
  }
  for (std::size_t i = 0; i < plan.ensemble_steps.size(); ++i) {
    const EnsembleStep& s = plan.ensemble_steps[i];
    EnsembleGraph::Step& step = g->steps[i];
    const ModelSignature& sig = sigs[i];
    std::vector<bool> mapped(sig.inputs.size(), false);
    for (const auto& [input, tensor] : s.input_map) {
      auto it = std::find_if(sig.inputs.begin(), sig.inputs.end(),
                             [&](const TensorSpec& t) { return t.name == input; });
      if (it == sig.inputs.end()) {
        std::string names;
        for (const TensorSpec& t : sig.inputs) names += (names.empty() ? "" : ", ") + t.name;
        return bad_ensemble(plan, step.label + " input_map names input '" + input +
                                      "', which the model does not have (it has " + names + ")");
      }
      const auto k = static_cast<std::size_t>(it - sig.inputs.begin());
      const std::size_t id = ids.at(tensor);  // check_ensemble_graph: every read tensor exists
      const Made& m = made.at(id);
      if (!compatible(m.spec, *it)) {
        return bad_ensemble(plan, "tensor '" + tensor + "': " + m.by + " is " + describe(m.spec) +
                                      ", but " + step.label + " input '" + input + "' expects " +
                                      describe(*it));
      }
      if (mapped[k]) {
        return bad_ensemble(plan, step.label + " input '" + input + "' is mapped twice");
      }
      mapped[k] = true;
      step.input_names.push_back(input);
      step.input_dtypes.push_back(it->dtype);
      step.inputs.push_back(id);
      if (m.step >= 0) {
        ++step.waits_for;
        auto& feeds = g->steps[static_cast<std::size_t>(m.step)].feeds;
        auto f =
            std::find_if(feeds.begin(), feeds.end(), [&](const auto& p) { return p.first == i; });
        if (f == feeds.end()) {
          feeds.emplace_back(i, 1);
        } else {
          ++f->second;
        }
      }
    }
    for (std::size_t k = 0; k < mapped.size(); ++k) {
      if (!mapped[k]) {
        return bad_ensemble(plan, step.label + " input '" + sig.inputs[k].name +
                                      "' is not in its input_map (every input of the model "
                                      "needs a tensor)");
      }
    }
  }
  for (const TensorSpec& out : plan.outputs) {
    const std::size_t id = ids.at(out.name);  // check_ensemble_graph: a step makes it
    const Made& m = made.at(id);
    if (!compatible(m.spec, out)) {
      return bad_ensemble(plan, "output '" + out.name + "' is listed as " + describe(out) +
                                    ", but " + m.by + " is " + describe(m.spec));
    }
    g->outputs.push_back(id);
  }
  return std::shared_ptr<const EnsembleGraph>(std::move(g));
}

void EnsembleCounters::record(bool ok, std::uint64_t ns, std::uint64_t rows,
                              std::uint64_t queued) noexcept {
  if (ok) {
    queue_ns.fetch_add(queued, std::memory_order_relaxed);
    inference_count.fetch_add(rows, std::memory_order_relaxed);
    success_count.fetch_add(1, std::memory_order_relaxed);
    success_ns.fetch_add(ns, std::memory_order_relaxed);
  } else {
    fail_count.fetch_add(1, std::memory_order_relaxed);
    fail_ns.fetch_add(ns, std::memory_order_relaxed);
  }
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  last_inference_ms.store(now, std::memory_order_relaxed);
}

InferenceStats EnsembleCounters::stats() const {
  InferenceStats s;
  const std::uint64_t n = success_count.load(std::memory_order_relaxed);
  s.inference_count = inference_count.load(std::memory_order_relaxed);
  s.execution_count = n;
  s.last_inference_ms = last_inference_ms.load(std::memory_order_relaxed);
  s.success = {n, success_ns.load(std::memory_order_relaxed)};
  s.fail = {fail_count.load(std::memory_order_relaxed), fail_ns.load(std::memory_order_relaxed)};
  s.queue = {n, queue_ns.load(std::memory_order_relaxed)};
  return s;
}

}  // namespace asyncinfer::server
