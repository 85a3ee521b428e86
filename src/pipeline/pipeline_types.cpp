// The pipeline's public value types (pipeline.hpp): StageSpec's builders and PipelineMetrics'
// bottleneck and Prometheus text. PipelineCore itself is in pipeline.cpp.
#include "asyncinfer/pipeline.hpp"

#include "metrics/prometheus_text.hpp"

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
  const std::string p = std::string(prefix) + "_";
  metrics::Families out;
  out.counter(p + "pipeline_items_completed", "Items delivered with a result", {},
              static_cast<double>(completed));
  out.counter(p + "pipeline_items_failed", "Items that ended in an error", {},
              static_cast<double>(failed));
  out.counter(p + "pipeline_items_timed_out", "Items that passed their deadline", {},
              static_cast<double>(timed_out));
  out.counter(p + "pipeline_items_cancelled", "Items cancelled", {},
              static_cast<double>(cancelled));
  out.gauge(p + "pipeline_items_in_flight", "Items submitted and not yet delivered", {},
            static_cast<double>(in_flight));
  for (const auto& s : stages) {
    const metrics::Labels l = {{"stage", s.name}, {"kind", s.kind}};
    out.counter(p + "pipeline_stage_items", "Items the stage has processed", l,
                static_cast<double>(s.items));
    out.counter(p + "pipeline_stage_busy_seconds", "Seconds the stage was busy", l, s.busy_s);
    out.gauge(p + "pipeline_stage_utilisation", "Busy time over wall time", l, s.utilisation);
    out.gauge(p + "pipeline_stage_queued", "Items waiting at the stage", l,
              static_cast<double>(s.queued));
    out.histogram(p + "pipeline_stage_queue_duration_us", "Time items waited at the stage (us)",
                  {{"stage", s.name}}, s.queue_us);
  }
  out.histogram(p + "pipeline_item_duration_us", "Submit to delivery (us)", {}, latency_us);
  return out.text();
}

}  // namespace asyncinfer
