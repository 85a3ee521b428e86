// info.cpp — `asyncinfer info [--device D] [--model M]`: the device and model backends built into
// the library, and when asked, a device's DeviceInfo and a model's signature.
#include <cstdio>
#include <memory>
#include <string>

#include "asyncinfer/device.hpp"
#include "asyncinfer/model.hpp"
#include "cli_options.hpp"
#include "commands.hpp"

namespace asyncinfer::cli {
namespace {

struct InfoOptions {
  std::string device;
  std::string model;
  BackendParameters backend_parameters;
};

/// A device or model that cannot be had (unknown, missing, not built, no hardware) is a usage
/// error, as in bench.
int usage_or_failure(const Status& /*s*/) { return kExitUsage; }

int run_info(const InfoOptions& o) {
  std::string backends;
  for (const std::string& b : device_backends()) backends += (backends.empty() ? "" : ", ") + b;
  std::printf("device backends: %s\n", backends.c_str());
  std::string models;
  for (const std::string& m : model_backends()) models += (models.empty() ? "" : ", ") + m;
  std::printf("model backends:  %s\n", models.c_str());
  int code = kExitOk;
  if (!o.device.empty()) {
    auto dev = open_device(o.device);
    if (!dev.ok()) {
      std::fprintf(stderr, "asyncinfer info: error: --device: %s\n",
                   dev.status().to_string().c_str());
      code = usage_or_failure(dev.status());
    } else {
      const DeviceInfo& i = (*dev)->info();
      std::printf("device %s\n", o.device.c_str());
      std::printf("  name              %s\n", i.name.c_str());
      std::printf("  kind              %s\n", std::string(to_string(i.kind)).c_str());
      std::printf("  description       %s\n", i.description.c_str());
      std::printf("  async             %s\n", i.async ? "yes" : "no");
      std::printf("  simulated         %s\n", i.simulated ? "yes" : "no");
      std::printf("  unified memory    %s\n", i.unified_memory ? "yes" : "no");
      std::printf("  cancellable work  %s\n", i.cancellable_work ? "yes" : "no");
      std::printf("  compute engines   %d\n", i.compute_engines);
      std::printf("  copy engines      %d\n", i.copy_engines);
      const DeviceCapabilities& c = i.capabilities;
      std::printf(
          "  capabilities      caller_run_streams=%s host_funcs_may_call_device=%s "
          "host_addressable_memory=%s\n",
          c.caller_run_streams ? "yes" : "no", c.host_funcs_may_call_device ? "yes" : "no",
          c.host_addressable_memory ? "yes" : "no");
    }
  }
  if (!o.model.empty()) {
    ModelOptions mo;
    mo.backend_parameters = o.backend_parameters;
    auto model = load_model(o.model, mo);
    if (!model.ok()) {
      std::fprintf(stderr, "asyncinfer info: error: --model: %s\n",
                   model.status().to_string().c_str());
      if (code == kExitOk) code = usage_or_failure(model.status());
    } else {
      std::printf("model %s\n", (*model)->name().c_str());
      std::printf("  signature         %s\n", (*model)->signature().to_string().c_str());
      std::printf("  cancellable       %s\n", (*model)->cancellable() ? "yes" : "no");
    }
  }
  return code;
}

}  // namespace

Command add_info_command(CLI::App& parent) {
  auto opts = std::make_shared<InfoOptions>();
  CLI::App* app = parent.add_subcommand(
      "info", "List the device backends built; describe a device and a model");
  app->add_option("--device,-d", opts->device,
                  "Device to open and describe: cpu, sim, sim:<key>=<value>,..., cuda:0");
  add_backend_parameter_option(*app, opts->backend_parameters);
  app->add_option("--model,-m", opts->model,
                  "Model to load and describe: builtin:identity, builtin:fixed_cost?..., "
                  "builtin:faulty?..., path/to/model.pt, model.onnx, model.xml");
  return Command{app, [opts] { return run_info(*opts); }};
}

}  // namespace asyncinfer::cli
