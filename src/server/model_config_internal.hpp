// model_config_internal.hpp — what the files that read a config.pbtxt share (internal to
// src/server): the error of a bad field, and the steps of plan_model() that turn one section of
// the config into ModelPlan's fields. The protobuf types appear here only declared; the files that
// use them are built like libprotobuf (src/server/CMakeLists.txt says why).
//
// The files (model_config.hpp has the design):
//   model_config.cpp           TextFormat parsing, plan_model(): the fields refused or ignored,
//                              platform / backend, version_policy
//   model_config_sections.cpp  parameters → EngineOptions, input / output → TensorSpecs,
//                              instance_group → device and workers, dynamic_batching → batching
//   model_plan.cpp             ModelPlan and VersionPolicy, check_signature, datatype names
//                              (no protobuf)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model_config.hpp"

namespace inference {
class ModelConfig;
}  // namespace inference

namespace asyncinfer::server {

/// invalid_argument "model '<model>': config.pbtxt: <what>".
Status bad(std::string_view model, const std::string& what);

/// Every file name a config gives (default_model_filename, a warm-up's input_data_file) must be
/// one path component that stays inside the folder it is read from (`folder`, for the message):
/// not empty, no '/', no NUL, not "." or "..". A load request's config override is a client's
/// text, and a name such as "/tmp/x.py" or "../../x" would make the server read, or for a
/// model.py run, a file outside the repository. invalid_argument naming `field` and the name.
Status check_file_name(std::string_view model, std::string_view field, const std::string& name,
                       std::string_view folder);

/// What one config may ask for at most, whatever the machine (a load request's config override
/// is a client's text): instances of one model in all groups (the serve command bounds them
/// further by the machine, RepositoryOptions::max_instances), and runs of one warm-up sample
/// (run one window at a time, model_repository.cpp).
inline constexpr int kMaxInstanceCount = 4096;
inline constexpr std::uint32_t kMaxWarmupCount = 10000;

// The steps of plan_model(), each over one section of the config (model_config_sections.cpp).
// Warnings for ignored fields are appended to `warnings`.
/// parameters: asyncinfer's own keys into the plan; the others into plan.backend_parameters.
Status apply_parameters(const inference::ModelConfig& c, std::string_view model, ModelPlan& plan);
/// For a backend that takes no parameters of its own: a warning for each key apply_parameters
/// did not know (plan.backend_parameters), which are then dropped.
void warn_backend_parameters(std::string_view model, ModelPlan& plan,
                             std::vector<std::string>* warnings);
Status plan_tensors(const inference::ModelConfig& c, std::string_view model, ModelPlan& plan,
                    std::vector<std::string>* warnings);
Status plan_instances(const inference::ModelConfig& c, std::string_view model, ModelPlan& plan,
                      std::vector<std::string>* warnings);
/// model_warmup → WarmupSample: names, data types, dims, one data source each, batch_size within
/// max_batch_size.
Status plan_warmup(const inference::ModelConfig& c, std::string_view model, ModelPlan& plan);
Status plan_batching(const inference::ModelConfig& c, std::string_view model, ModelPlan& plan,
                     std::vector<std::string>* warnings);
/// sequence_batching → EngineOptions::sequence_batching, and the model inputs its controls and
/// states fill and the outputs its states keep (ModelPlan::sequence_inputs, sequence_outputs).
Status plan_sequences(const inference::ModelConfig& c, std::string_view model, ModelPlan& plan);

}  // namespace asyncinfer::server
