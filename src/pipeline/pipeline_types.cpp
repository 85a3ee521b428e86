// The pipeline's public value types (pipeline.hpp): StageSpec's builders and PipelineMetrics'
// bottleneck and Prometheus text. PipelineCore itself is in pipeline.cpp.
#include "asyncinfer/pipeline.hpp"

namespace asyncinfer {

StageSpec StageSpec::host(std::string name, HostStageFn fn, int concurrency) {
  StageSpec s;
  s.name = std::move(name);
  s.kind = StageKind::host;
  s.host_fn = std::move(fn);
  s.concurrency = concurrency;
  return s;
}

StageSpec StageSpec::on_device(std::string name, std::shared_ptr<Device> device, DeviceStageFn fn,
                               int stream_depth) {
  StageSpec s;
  s.name = std::move(name);
  s.kind = StageKind::device;
  s.device = std::move(device);
  s.device_fn = std::move(fn);
  s.stream_depth = stream_depth;
  return s;
}

StageSpec StageSpec::run_model(std::string name, std::shared_ptr<Device> device,
                               std::shared_ptr<Model> model, int stream_depth) {
  StageSpec s;
  s.name = std::move(name);
  s.kind = StageKind::device;
  s.device = std::move(device);
  s.model = std::move(model);
  s.stream_depth = stream_depth;
  return s;
}

StageSpec StageSpec::run_engine(std::string name, Engine& engine) {
  StageSpec s;
  s.name = std::move(name);
  s.kind = StageKind::engine;
  s.engine = &engine;
  return s;
}

std::string PipelineMetrics::bottleneck() const {
  const StageMetrics* best = nullptr;
  for (const auto& s : stages) {
    if (s.items > 0 && (best == nullptr || s.utilisation > best->utilisation)) best = &s;
  }
  return best == nullptr ? std::string() : best->name;
}

std::string PipelineMetrics::to_prometheus(std::string_view prefix) const {
  const std::string p(prefix);
  std::string out;
  auto add = [&](const std::string& name, const char* type, const std::string& labels,
                 const std::string& value) {
    out += "# TYPE " + p + "_" + name + " " + type + "\n";
    out += p + "_" + name + labels + " " + value + "\n";
  };
  add("pipeline_items_completed", "counter", "", std::to_string(completed));
  add("pipeline_items_failed", "counter", "", std::to_string(failed));
  add("pipeline_items_timed_out", "counter", "", std::to_string(timed_out));
  add("pipeline_items_cancelled", "counter", "", std::to_string(cancelled));
  add("pipeline_items_in_flight", "gauge", "", std::to_string(in_flight));
  for (const auto& s : stages) {
    const std::string l = "{stage=\"" + s.name + "\",kind=\"" + s.kind + "\"}";
    add("pipeline_stage_items", "counter", l, std::to_string(s.items));
    add("pipeline_stage_busy_seconds", "counter", l, std::to_string(s.busy_s));
    add("pipeline_stage_utilisation", "gauge", l, std::to_string(s.utilisation));
    add("pipeline_stage_queued", "gauge", l, std::to_string(s.queued));
    append_prometheus_histogram(out, p + "_pipeline_stage_queue_duration_us",
                                "Time items waited at the stage (us)", s.queue_us,
                                "stage=\"" + s.name + "\"");
  }
  append_prometheus_histogram(out, p + "_pipeline_item_duration_us", "Submit to delivery (us)",
                              latency_us);
  return out;
}

}  // namespace asyncinfer
