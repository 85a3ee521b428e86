// The HTTP encoding's small bodies (oip_json.hpp): {"error": ...}, server and model metadata,
// Triton's repository index and its request, and the JSON helpers its other files share
// (oip_json_internal.hpp). Requests are decoded in oip_json_decode.cpp, responses encoded in
// oip_json_encode.cpp.
#include "oip_json.hpp"

#include <openssl/evp.h>

#include <map>
#include <optional>

#include <string>

#include "model_config.hpp"
#include "oip_json_internal.hpp"

namespace asyncinfer::server {
namespace {

struct TooDeep {};

json tensor_metadata(const TensorSpec& s) {
  return {{"name", s.name}, {"datatype", std::string(oip_datatype(s.dtype))}, {"shape", s.shape}};
}

}  // namespace

Result<json> parse_json(std::string_view text, int max_depth) {
  try {
    auto cb = [max_depth](int depth, json::parse_event_t event, json&) {
      if ((event == json::parse_event_t::object_start ||
           event == json::parse_event_t::array_start) &&
          depth >= max_depth) {
        throw TooDeep{};
      }
      return true;
    };
    return json::parse(text.begin(), text.end(), cb);
  } catch (const TooDeep&) {
    return invalid_argument_error("JSON nested deeper than " + std::to_string(max_depth) +
                                  " levels");
  } catch (const json::exception& e) {
    // nlohmann's message names the byte and what it expected.
    std::string what = e.what();
    if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    return invalid_argument_error("malformed JSON: " + what);
  }
}

std::string quote(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string error_json(std::string_view message) { return "{\"error\":" + quote(message) + "}"; }

std::string server_metadata_json(const InferenceServer& server) {
  json j = {{"name", server.options().name},
            {"version", server.options().version},
            {"extensions", kServerExtensions}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string model_metadata_json(const ServedModel& model, const ModelVersion& shown,
                                const ModelVersion* version) {
  json versions = json::array();
  if (version != nullptr) {
    versions.push_back(version->version_text);
  } else {
    for (const auto& v : model.versions) {
      if (v->ready()) versions.push_back(v->version_text);
    }
  }
  json inputs = json::array();
  json outputs = json::array();
  for (const TensorSpec& s : shown.signature.inputs) inputs.push_back(tensor_metadata(s));
  for (const TensorSpec& s : shown.signature.outputs) outputs.push_back(tensor_metadata(s));
  json j = {{"name", model.name},
            {"versions", versions},
            {"platform", model.platform},
            {"inputs", inputs},
            {"outputs", outputs}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string repository_index_json(const ModelRepository& repository, bool ready_only) {
  json list = json::array();
  for (const IndexEntry& e : repository.snapshot()->index(ready_only)) {
    json j = {{"name", e.name}};
    if (!e.version.empty()) j["version"] = e.version;
    j["state"] = std::string(to_string(e.state));
    if (!e.reason.empty()) j["reason"] = e.reason;
    list.push_back(std::move(j));
  }
  return list.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string model_statistics_json(const std::vector<ModelRef>& versions) {
  auto duration = [](const DurationStat& d) { return json{{"count", d.count}, {"ns", d.ns}}; };
  json list = json::array();
  for (const ModelRef& v : versions) {
    const InferenceStats s = v->statistics();
    json batches = json::array();
    for (const BatchSizeStats& b : s.batch_stats) {
      batches.push_back({{"batch_size", b.batch_size},
                         {"compute_input", duration(b.compute_input)},
                         {"compute_infer", duration(b.compute_infer)},
                         {"compute_output", duration(b.compute_output)}});
    }
    list.push_back({{"name", v->model_name},
                    {"version", v->version_text},
                    {"last_inference", s.last_inference_ms},
                    {"inference_count", s.inference_count},
                    {"execution_count", s.execution_count},
                    {"inference_stats",
                     {{"success", duration(s.success)},
                      {"fail", duration(s.fail)},
                      {"queue", duration(s.queue)},
                      {"compute_input", duration(s.compute_input)},
                      {"compute_infer", duration(s.compute_infer)},
                      {"compute_output", duration(s.compute_output)},
                      {"cache_hit", duration(s.cache_hit)},
                      {"cache_miss", duration(s.cache_miss)}}},
                    {"response_stats", json::object()},
                    {"batch_stats", batches},
                    {"memory_usage", json::array()}});
  }
  return json{{"model_stats", list}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<bool> parse_index_request(std::string_view body, int max_depth) {
  if (body.empty()) return false;
  ASYNCINFER_ASSIGN_OR_RETURN(json j, parse_json(body, max_depth));
  if (!j.is_object()) return invalid_argument_error("the request body must be a JSON object");
  auto it = j.find("ready");
  if (it == j.end()) return false;
  if (!it->is_boolean()) return invalid_argument_error("\"ready\" must be true or false");
  return it->get<bool>();
}

Result<Parameters> parse_log_settings_request(std::string_view body, int max_depth) {
  if (body.empty()) return invalid_argument_error("the request body must be a JSON object");
  ASYNCINFER_ASSIGN_OR_RETURN(json j, parse_json(body, max_depth));
  if (!j.is_object()) return invalid_argument_error("the request body must be a JSON object");
  Parameters out;
  for (const auto& [name, value] : j.items()) {
    if (value.is_boolean()) {
      out[name] = value.get<bool>();
    } else if (value.is_number_unsigned()) {
      out[name] = value.get<std::uint64_t>();
    } else if (value.is_number_integer()) {
      out[name] = value.get<std::int64_t>();
    } else if (value.is_number_float()) {
      out[name] = value.get<double>();
    } else if (value.is_string()) {
      out[name] = value.get<std::string>();
    } else {
      return invalid_argument_error("log setting '" + name +
                                    "' must be a boolean, a number or a string");
    }
  }
  return out;
}

Result<TraceSettingUpdate> parse_trace_settings_request(std::string_view body, int max_depth) {
  std::map<std::string, std::optional<std::vector<std::string>>, std::less<>> given;
  if (body.empty()) return parse_trace_setting_update(given);
  ASYNCINFER_ASSIGN_OR_RETURN(json j, parse_json(body, max_depth));
  if (!j.is_object()) return invalid_argument_error("the request body must be a JSON object");
  for (const auto& [name, value] : j.items()) {
    if (name != "trace_file" && name != "trace_level" && name != "trace_rate" &&
        name != "trace_count" && name != "log_frequency") {
      continue;  // Triton ignores other names
    }
    if (value.is_null()) {
      given[name] = std::nullopt;
    } else if (name == "trace_level") {
      if (!value.is_array()) {
        return invalid_argument_error("'trace_level' must be an array of strings");
      }
      std::vector<std::string> levels;
      for (const json& l : value) {
        if (!l.is_string()) {
          return invalid_argument_error("'trace_level' must be an array of strings");
        }
        levels.push_back(l.get<std::string>());
      }
      given[name] = std::move(levels);
    } else if (value.is_string()) {
      given[name] = std::vector<std::string>{value.get<std::string>()};
    } else {
      return invalid_argument_error("trace setting '" + name + "' must be a string (or null)");
    }
  }
  return parse_trace_setting_update(given);
}

Result<SharedMemoryRegisterCall> parse_shared_memory_register(std::string_view body,
                                                              int max_depth) {
  if (body.empty()) {
    return invalid_argument_error(
        "the register body must be a JSON object with \"key\" and "
        "\"byte_size\"");
  }
  ASYNCINFER_ASSIGN_OR_RETURN(json j, parse_json(body, max_depth));
  if (!j.is_object()) return invalid_argument_error("the request body must be a JSON object");
  SharedMemoryRegisterCall call;
  auto key = j.find("key");
  if (key == j.end() || !key->is_string()) {
    return invalid_argument_error("\"key\" (the shared memory object's name, a string) is missing");
  }
  call.key = key->get<std::string>();
  auto size_of = [&](const char* name, bool required, std::size_t* out) -> Status {
    auto it = j.find(name);
    if (it == j.end()) {
      return required ? invalid_argument_error("\"" + std::string(name) + "\" is missing")
                      : Status();
    }
    if (!it->is_number_unsigned()) {
      return invalid_argument_error("\"" + std::string(name) + "\" must be an integer >= 0");
    }
    *out = it->get<std::size_t>();
    return Status();
  };
  ASYNCINFER_RETURN_IF_ERROR(size_of("offset", false, &call.offset));
  ASYNCINFER_RETURN_IF_ERROR(size_of("byte_size", true, &call.byte_size));
  return call;
}

std::string shared_memory_status_json(const std::vector<SharedMemoryRef>& regions) {
  json list = json::array();
  for (const SharedMemoryRef& r : regions) {
    list.push_back({{"name", r->name()},
                    {"key", r->key()},
                    {"offset", r->offset()},
                    {"byte_size", r->byte_size()}});
  }
  return list.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

// RFC 4648 base64 with padding, by OpenSSL's EVP_DecodeBlock; nullopt for anything else.
std::optional<std::string> decode_base64(const std::string& text) {
  if (text.size() % 4 != 0) return std::nullopt;
  std::string out(text.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(text.data()),
                                static_cast<int>(text.size()));
  if (n < 0) return std::nullopt;
  // EVP_DecodeBlock counts the padding's bytes (zeros) too.
  std::size_t pad = 0;
  for (auto c = text.rbegin(); c != text.rend() && *c == '=' && pad < 2; ++c) ++pad;
  out.resize(static_cast<std::size_t>(n) - pad);
  return out;
}

}  // namespace

Result<RepositoryCall> parse_repository_call(std::string_view body, int max_depth, bool load) {
  RepositoryCall call;
  if (body.empty()) return call;
  ASYNCINFER_ASSIGN_OR_RETURN(json j, parse_json(body, max_depth));
  if (!j.is_object()) return invalid_argument_error("the request body must be a JSON object");
  auto params = j.find("parameters");
  if (params == j.end()) return call;
  if (!params->is_object()) return invalid_argument_error("\"parameters\" must be a JSON object");
  for (auto it = params->begin(); it != params->end(); ++it) {
    const std::string& key = it.key();
    if (load && key.rfind("file:", 0) == 0) {
      std::optional<std::string> contents;
      if (it->is_string()) contents = decode_base64(it->get_ref<const std::string&>());
      if (!contents) {
        return invalid_argument_error("parameter '" + key +
                                      "' must be a string holding the file's contents in base64");
      }
      call.files.emplace_back(key.substr(5), std::move(*contents));
      continue;
    }
    if (load && key == "config") {
      // Triton's HTTP form: the ModelConfig's JSON text, as a string.
      if (!it->is_string()) {
        return invalid_argument_error(
            "parameter 'config' must be a string holding a ModelConfig in JSON");
      }
      call.config = it->get<std::string>();
    } else if (!load && key == "unload_dependents" && !it->is_boolean()) {
      return invalid_argument_error("parameter 'unload_dependents' must be true or false");
    }
  }
  return call;
}

}  // namespace asyncinfer::server
