// Unit tests of the server's protocol-neutral pieces (src/server): config.pbtxt parsing and
// planning, version policies, datatype names, the status table, the OIP JSON/binary codec, the
// response cache, and model control (load, reload, unload) on a real repository folder.
// The end-to-end tests over real sockets are tests/server/*.py.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <mutex>

#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "classification.hpp"
#include "ensemble.hpp"
#include "grpc/grpc_acceptor.hpp"
#include "http/oip_json.hpp"
#include "inference_server.hpp"
#include "limits.hpp"
#include "model/backend.hpp"
#include "model_config.hpp"
#include "response_cache.hpp"
#include "server_log.hpp"
#include "status_mapping.hpp"
#include "trace.hpp"

namespace asyncinfer::server {
namespace {

constexpr const char* kIdentity = R"(
name: "m"
backend: "builtin"
max_batch_size: 8
input [ { name: "input0", data_type: TYPE_FP32, dims: [ 16 ] } ]
output [ { name: "output0", data_type: TYPE_FP32, dims: [ 16 ] } ]
parameters { key: "uri" value { string_value: "builtin:identity?shape=16&max_batch=8" } }
)";

Result<ModelPlan> plan(const std::string& text, std::vector<std::string>* warnings = nullptr) {
  std::vector<std::string> w;
  return plan_model_config(text, "m/config.pbtxt", "m", warnings ? warnings : &w);
}

TEST(ServerConfig, BuiltinModelPlan) {
  auto p = plan(kIdentity);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kind, ModelPlan::Kind::builtin);
  EXPECT_EQ(p->platform, "asyncinfer_builtin");
  EXPECT_EQ(p->builtin_uri, "builtin:identity?shape=16&max_batch=8");
  EXPECT_TRUE(p->device_auto);  // no instance_group: KIND_AUTO
  EXPECT_EQ(p->engine.workers, 1);
  EXPECT_EQ(p->engine.batching.max_batch_size, 1);  // no dynamic_batching: one request at a time
  ASSERT_EQ(p->inputs.size(), 1u);
  EXPECT_EQ(p->inputs[0].shape, (Shape{-1, 16}));
  EXPECT_EQ(p->versions.kind, VersionPolicy::Kind::latest);
}

TEST(ServerConfig, DynamicBatchingAndQueuePolicy) {
  auto p = plan(std::string(kIdentity) + R"(
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 300
  preserve_ordering: true
  priority_levels: 4
  default_priority_level: 3
  default_queue_policy { default_timeout_microseconds: 250000 allow_timeout_override: true
                         max_queue_size: 17 }
}
instance_group [ { kind: KIND_GPU, gpus: [ 1 ], count: 3 } ]
parameters { key: "retries" value { string_value: "2" } }
parameters { key: "watchdog_ms" value { string_value: "1500" } }
parameters { key: "spin_wait_us" value { string_value: "0" } }
)");
  ASSERT_TRUE(p.ok()) << p.status();
  const EngineOptions& e = p->engine;
  EXPECT_EQ(e.batching.max_batch_size, 8);
  EXPECT_EQ(e.batching.preferred_batch_sizes, (std::vector<std::int64_t>{4, 8}));
  EXPECT_EQ(e.batching.max_queue_delay, std::chrono::microseconds(300));
  EXPECT_TRUE(e.ordered_delivery);
  EXPECT_EQ(e.priority_levels, 4);
  EXPECT_EQ(e.default_priority, 3);
  EXPECT_EQ(e.default_timeout, std::chrono::microseconds(250000));
  EXPECT_TRUE(e.allow_timeout_override);
  EXPECT_EQ(e.queue_capacity, 17u);
  EXPECT_EQ(e.workers, 3);
  EXPECT_EQ(e.retry.max_attempts, 3);
  EXPECT_EQ(e.watchdog, std::chrono::milliseconds(1500));
  EXPECT_EQ(e.spin_wait, std::chrono::microseconds(0));
  EXPECT_EQ(p->device, "cuda:1");
  EXPECT_FALSE(p->device_auto);
}

TEST(ServerConfig, DeviceParameterWinsOverKind) {
  auto p = plan(std::string(kIdentity) + R"(
instance_group [ { kind: KIND_CPU, count: 2 } ]
parameters { key: "device" value { string_value: "sim:compute_engines=2" } }
)");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->device, "sim:compute_engines=2");
  EXPECT_EQ(p->engine.workers, 2);
}

TEST(ServerConfig, UnknownFieldIsAnErrorNamingIt) {
  auto p = plan(std::string(kIdentity) + "frobnicate: true\n");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(p.status().message().find("m/config.pbtxt:8:"), std::string_view::npos) << p.status();
  EXPECT_NE(p.status().message().find("no field named \"frobnicate\""), std::string_view::npos);
}

std::vector<std::string> strings_of(const Tensor& t) {
  auto views = t.string_elements();
  EXPECT_TRUE(views.ok()) << views.status();
  return views.ok() ? std::vector<std::string>(views->begin(), views->end())
                    : std::vector<std::string>{};
}

TEST(Classification, TopClassesPerBatchItemWithLabelsAndTritonsNumberFormat) {
  const std::vector<double> v{0.25, 2.5, -1, 2.5, /* item 2 */ 1, 2, 3, 4};
  auto t = Tensor::from_values<double>({2, 4}, v);
  ASSERT_TRUE(t.ok());
  const std::vector<std::string> labels{"a", "b"};  // shorter than the classes: no label past it
  auto c = classify(*t, /*batched=*/true, 2, &labels);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->dtype(), DType::bytes);
  EXPECT_EQ(c->shape(), (Shape{2, 2}));
  EXPECT_EQ(strings_of(*c),
            (std::vector<std::string>{"2.500000:1:b", "2.500000:3", "4.000000:3", "3.000000:2"}));
  // Unbatched: one item of all the values; more classes than values gives them all.
  auto u = classify(*Tensor::from_values<std::uint8_t>({3}, std::vector<std::uint8_t>{7, 9, 8}),
                    false, 10, nullptr);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->shape(), (Shape{3}));
  EXPECT_EQ(strings_of(*u), (std::vector<std::string>{"9:1", "8:2", "7:0"}));
  // An empty batch.
  auto e = classify(*Tensor::empty(DType::f32, {0, 4}), true, 2, nullptr);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->shape(), (Shape{0, 2}));
}

TEST(Classification, RefusesWhatHasNoOrderAndBadCounts) {
  auto b = classify(*Tensor::empty(DType::f16, {1, 4}), true, 1, nullptr);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message(),
            "class result not available for output due to unsupported type 'FP16'");
  EXPECT_FALSE(check_classifiable(DType::bytes).ok());
  EXPECT_FALSE(check_classifiable(DType::boolean).ok());
  Parameters p{{"classification", std::int64_t{-1}}};
  EXPECT_EQ(class_count(p, "y").status().code(), StatusCode::invalid_argument);
  p["classification"] = std::string("3");
  EXPECT_EQ(class_count(p, "y").status().code(), StatusCode::invalid_argument);
  p["classification"] = std::int64_t{3};
  EXPECT_EQ(*class_count(p, "y"), 3u);
  EXPECT_EQ(*class_count({}, "y"), 0u);
}

TEST(Classification, LabelFilesAndTheirNames) {
  const auto path = std::filesystem::temp_directory_path() / "asyncinfer-labels-test.txt";
  std::ofstream(path) << "cat\r\ndog\n\nbird";  // CRLF, an empty label, no final newline
  auto labels = read_class_labels(path.string());
  std::filesystem::remove(path);
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_EQ(**labels, (std::vector<std::string>{"cat", "dog", "", "bird"}));
  EXPECT_EQ(read_class_labels("/nonexistent/labels.txt").status().code(), StatusCode::not_found);
  // label_filename names a file of the model's folder.
  std::string text = kIdentity;
  text.replace(text.find("dims: [ 16 ] } ]\nparameters"), 16,
               "dims: [ 16 ], label_filename: \"../x\" } ]");
  auto p = plan(text);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("label_filename '../x' must name a file in the model's"),
            std::string_view::npos);
  text.replace(text.find("../x"), 4, "l.txt");
  p = plan(text);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->label_files.at("output0"), "l.txt");
}

std::string read_all(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string text;
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) text.append(buffer, n);
  return text;
}

TEST(ServerLog, LevelsFormatAndAllOrNothingUpdates) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  ServerLog log("srv", f);
  log.write(LogLevel::info, "one");
  log.write(LogLevel::debug, "hidden at verbose level 0");
  log.write_line("model 'm': warning: w");
  log.write_line("model 'm': UNAVAILABLE: e");
  // A bad change changes nothing, even beside a good one.
  auto bad = log.update({{"log_info", false}, {"log_verbose_level", std::int64_t{-1}}});
  EXPECT_EQ(bad.status().code(), StatusCode::invalid_argument);
  EXPECT_TRUE(log.settings().log_info);
  auto good = log.update({{"log_info", false},
                          {"log_verbose_level", std::int64_t{1}},
                          {"log_format", std::string("ISO8601")}});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(log_settings_json(*good),
            R"({"log_file":"","log_info":false,"log_warning":true,"log_error":true,)"
            R"("log_verbose_level":1,"log_format":"ISO8601"})");
  log.write(LogLevel::info, "off");
  log.write(LogLevel::debug, "shown");
  log.write_line("model 'm': UNAVAILABLE: again");
  const std::string text = read_all(f);
  std::fclose(f);
  EXPECT_NE(text.find("srv: one\nsrv: model 'm': warning: w\nsrv: model 'm': UNAVAILABLE: e\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("hidden"), std::string::npos);
  EXPECT_EQ(text.find("off"), std::string::npos);
  EXPECT_NE(text.find("Z V srv: shown\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Z E srv: model 'm': UNAVAILABLE: again\n"), std::string::npos) << text;
  EXPECT_EQ(log.update({{"log_file", std::string("/tmp/x")}}).status().code(),
            StatusCode::invalid_argument);
  EXPECT_EQ(log.update({{"log_format", std::string("json")}}).status().code(),
            StatusCode::invalid_argument);
}

// ---- Triton's trace extension (trace.hpp)
// ---------------------------------------------------------

/// A setting change as the HTTP and gRPC frontends make it: name → values, nullopt = clear.
TraceSettingUpdate trace_update(
    std::map<std::string, std::optional<std::vector<std::string>>, std::less<>> given) {
  auto u = parse_trace_setting_update(given);
  EXPECT_TRUE(u.ok()) << u.status();
  return u.ok() ? *u : TraceSettingUpdate{};
}

TEST(Trace, ConfigParsesAsTritonDoes) {
  auto c = parse_trace_config({"triton,file=t.json", "level=TIMESTAMPS", "level=tensors", "rate=1",
                               "count=5", "triton,log-frequency=2"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->level, kTraceTimestamps | kTraceTensors);
  EXPECT_EQ(c->rate, 1u);
  EXPECT_EQ(c->count, 5);
  EXPECT_EQ(c->log_frequency, 2u);
  EXPECT_EQ(c->file, "t.json");
  EXPECT_EQ(c->mode, TraceMode::triton);
  auto o = parse_trace_config({"mode=opentelemetry", "level=TIMESTAMPS",
                               "opentelemetry,url=http://collector:4318/v1/traces",
                               "opentelemetry,resource=service.name=svc",
                               "opentelemetry,bsp_max_queue_size=7",
                               "opentelemetry,bsp_schedule_delay=20"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->mode, TraceMode::opentelemetry);
  EXPECT_EQ(o->otel.url, "http://collector:4318/v1/traces");
  ASSERT_EQ(o->otel.resource.size(), 1u);
  EXPECT_EQ(o->otel.resource[0].first, "service.name");
  EXPECT_EQ(o->otel.resource[0].second, "svc");
  EXPECT_EQ(o->otel.bsp_max_queue_size, 7u);
  EXPECT_EQ(o->otel.bsp_schedule_delay_ms, 20u);
  // The older flags, and --trace-config over them.
  LegacyTraceFlags legacy{std::string("old.json"), {"TIMESTAMPS"}, std::string("3"), {}, {}};
  std::vector<std::string> warnings;
  auto l =
      parse_trace_config({"rate=4"}, legacy, [&](const std::string& w) { warnings.push_back(w); });
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->file, "old.json");
  EXPECT_EQ(l->rate, 4u);
  EXPECT_EQ(warnings.size(), 1u);
  // Refused: Triton's format errors, unknown keys, bad numbers, tracing without a file.
  for (auto [spec, expect] :
       {std::pair{"rate", "format"}, std::pair{",rate=1", "No trace mode"},
        std::pair{"jaeger,url=x", "invalid value for trace mode"}, std::pair{"rate=abc", "rate"},
        std::pair{"count=-2", "count"}, std::pair{"level=loud", "trace level"},
        std::pair{"colour=red", "unknown setting"},
        std::pair{"opentelemetry,url=https://x", "http://"},
        std::pair{"level=TIMESTAMPS", "needs a file"}}) {
    auto bad = parse_trace_config({spec});
    ASSERT_FALSE(bad.ok()) << spec;
    EXPECT_NE(bad.status().message().find(expect), std::string_view::npos)
        << spec << " → " << bad.status();
  }
}

TEST(Trace, UpdateErrorsInTritonsWords) {
  using Given = std::map<std::string, std::optional<std::vector<std::string>>, std::less<>>;
  for (auto [given, expect] :
       {std::pair{Given{{"trace_file", std::vector<std::string>{"x"}}}, "can not be updated"},
        std::pair{Given{{"trace_level", std::vector<std::string>{"OFF", "TIMESTAMPS"}}},
                  "Expect only one trace level 'OFF'"},
        std::pair{Given{{"trace_rate", std::vector<std::string>{"abc"}}},
                  "Unable to parse 'trace_rate', got: abc"},
        std::pair{Given{{"trace_count", std::vector<std::string>{"-5"}}}, "Expecting value >= -1"},
        std::pair{Given{{"log_frequency", std::vector<std::string>{"99999999999"}}},
                  "out of range"},
        std::pair{Given{{"trace_rate", std::vector<std::string>{"1", "2"}}},
                  "expect only 1 value"}}) {
    auto u = parse_trace_setting_update(given);
    ASSERT_FALSE(u.ok());
    EXPECT_NE(u.status().message().find(expect), std::string_view::npos) << u.status();
  }
  // Tracing with a rate of 0 is refused; turning it off with one is not.
  auto c = parse_trace_config({"triton,file=/dev/null", "level=TIMESTAMPS", "rate=1"});
  ASSERT_TRUE(c.ok());
  TraceManager m(*c);
  auto zero = m.update("", trace_update({{"trace_rate", std::vector<std::string>{"0"}}}));
  EXPECT_NE(zero.status().message().find("Attempting to set invalid trace setting"),
            std::string_view::npos)
      << zero.status();
  EXPECT_TRUE(m.update("", trace_update({{"trace_rate", std::vector<std::string>{"0"}},
                                         {"trace_level", std::vector<std::string>{"OFF"}}}))
                  .ok());
}

// trace_endpoint_test.py's test_http_clear_settings, on the manager.
TEST(Trace, ModelSettingsFallBackToTheGlobalOnesFieldByField) {
  auto c = parse_trace_config({"triton,file=g.log", "level=TIMESTAMPS", "rate=1"});
  ASSERT_TRUE(c.ok());
  TraceManager m(*c);
  EXPECT_TRUE(m.active());
  EXPECT_EQ(trace_settings_json(m.settings("simple")),
            R"({"trace_level":["TIMESTAMPS"],"trace_rate":"1","trace_count":"-1",)"
            R"("log_frequency":"0","trace_file":"g.log","trace_mode":"triton"})");
  using V = std::vector<std::string>;
  ASSERT_TRUE(
      m.update("simple", trace_update({{"trace_rate", V{"12"}}, {"log_frequency", V{"34"}}})).ok());
  ASSERT_TRUE(m.update("", trace_update({{"trace_rate", V{"56"}},
                                         {"trace_count", V{"78"}},
                                         {"trace_level", V{"OFF"}}}))
                  .ok());
  EXPECT_FALSE(m.active());
  auto g =
      m.update("", trace_update({{"trace_rate", std::nullopt}, {"trace_count", std::nullopt}}));
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->level, 0u);
  EXPECT_EQ(g->rate, 1u);  // its value at start
  EXPECT_EQ(g->count, -1);
  TraceSettings model = m.settings("simple");
  EXPECT_EQ(model.level, 0u);
  EXPECT_EQ(model.rate, 12u);
  EXPECT_EQ(model.count, -1);
  EXPECT_EQ(model.log_frequency, 34u);
  auto cleared = m.update(
      "simple", trace_update({{"trace_rate", std::nullopt}, {"trace_level", std::nullopt}}));
  ASSERT_TRUE(cleared.ok());
  EXPECT_EQ(cleared->rate, 1u);
  EXPECT_EQ(cleared->log_frequency, 34u);
  EXPECT_EQ(m.settings("").log_frequency, 0u);
  // A model's level on while the global one is off: tracing is active.
  ASSERT_TRUE(m.update("simple", trace_update({{"trace_level", V{"TIMESTAMPS"}}})).ok());
  EXPECT_TRUE(m.active());
  EXPECT_EQ(m.sample("other", std::nullopt), nullptr);
  EXPECT_NE(m.sample("simple", std::nullopt), nullptr);
}

TEST(Trace, SamplesEveryRateThWhileCountLastsAndRotatesFiles) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("asyncinfer_trace_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "t.json").string();
  {
    auto c = parse_trace_config(
        {"triton,file=" + file, "level=TIMESTAMPS", "rate=2", "count=3", "triton,log-frequency=2"});
    ASSERT_TRUE(c.ok()) << c.status();
    TraceManager m(*c);
    int sampled = 0;
    for (int i = 0; i < 10; ++i) {
      auto t = m.sample("m", std::nullopt);
      if (!t) continue;
      ++sampled;
      t->set_model("m", 1, "id" + std::to_string(i));
      t->record("HTTP_RECV_START", 10);
      t->record("REQUEST_START", 20);
      t->timeline()->queue_start_ns.store(30);
      t->timeline()->compute_start_ns.store(40);
      t->record_timeline();
      t->record("REQUEST_END", 90);
    }
    EXPECT_EQ(sampled, 3);  // requests 2, 4 and 6; then the count is spent
    EXPECT_EQ(m.settings("").count, 0);
  }
  // log_frequency 2: traces 1-2 in t.json.0, trace 3 (the count spent) in t.json.1.
  auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string first = read(dir / "t.json.0");
  const std::string second = read(dir / "t.json.1");
  EXPECT_FALSE(std::filesystem::exists(dir / "t.json.2"));
  auto j = nlohmann::json::parse(first);
  ASSERT_TRUE(j.is_array());
  // Per trace: the model record, then one record per timestamp, in time order.
  ASSERT_EQ(j.size(), 2u * 6u) << first;
  EXPECT_EQ(j[0]["timestamps"][0]["name"], "HTTP_RECV_START");
  EXPECT_EQ(j[1]["model_name"], "m");
  EXPECT_EQ(j[1]["model_version"], 1);
  EXPECT_EQ(j[1]["request_id"], "id1");
  EXPECT_EQ(j[2]["timestamps"][0]["name"], "REQUEST_START");
  EXPECT_EQ(j[3]["timestamps"][0]["name"], "QUEUE_START");
  EXPECT_EQ(j[3]["timestamps"][0]["ns"], 30);
  EXPECT_EQ(j[4]["timestamps"][0]["name"], "COMPUTE_START");
  EXPECT_EQ(j[5]["timestamps"][0]["name"], "REQUEST_END");
  EXPECT_EQ(nlohmann::json::parse(second).size(), 6u) << second;
  std::filesystem::remove_all(dir);
}

TEST(Trace, ChildrenAreWrittenWithTheirParentUnderItsId) {
  // Triton's child traces (an ensemble's steps, BLS calls): their own ids, parent_id the
  // parent's; not sampled (count=1 is spent by the parent alone); written with the parent, as
  // one trace. TENSORS: an input's text made once, recorded for both input activities.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("asyncinfer_trace_child_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "t.json").string();
  std::uint64_t parent_id = 0;
  std::uint64_t child_id = 0;
  {
    auto c = parse_trace_config(
        {"triton,file=" + file, "level=TIMESTAMPS", "level=TENSORS", "rate=1", "count=1"});
    ASSERT_TRUE(c.ok()) << c.status();
    TraceManager m(*c);
    std::shared_ptr<Trace> parent = m.sample("ens", std::nullopt);
    ASSERT_NE(parent, nullptr);
    EXPECT_EQ(m.sample("ens", std::nullopt), nullptr);  // the count is spent
    EXPECT_EQ(Trace::child_of(nullptr), nullptr);
    parent->set_model("ens", 1, "r1");
    parent->record("REQUEST_START", 10);
    std::shared_ptr<Trace> child = Trace::child_of(parent);
    ASSERT_NE(child, nullptr);
    parent_id = parent->id();
    child_id = child->id();
    EXPECT_NE(child_id, parent_id);
    EXPECT_EQ(child->parent_id(), parent_id);
    EXPECT_EQ(parent->parent_id(), 0u);
    child->set_model("step", 2, "r1");
    child->record("REQUEST_START", 20);
    auto x = Tensor::from_values<std::int32_t>({1, 3}, std::vector<std::int32_t>{1, -2, 3});
    ASSERT_TRUE(x.ok());
    child->record_tensor({"TENSOR_QUEUE_INPUT", "TENSOR_BACKEND_INPUT"}, "x", *x);
    child->record("REQUEST_END", 30);
    child.reset();  // held by nobody else: handed to the parent, not written alone
    EXPECT_FALSE(std::filesystem::exists(dir / "t.json.0"));
    parent->record("REQUEST_END", 40);
    parent.reset();  // the count spent and every trace collected: written now
    EXPECT_TRUE(std::filesystem::exists(dir / "t.json.0"));
  }
  std::ifstream in(dir / "t.json.0");
  auto j = nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  ASSERT_TRUE(j.is_array());
  std::map<std::uint64_t, nlohmann::json> models;
  std::vector<nlohmann::json> tensors;
  std::map<std::uint64_t, int> stamps;
  for (const auto& r : j) {
    if (r.contains("model_name")) models[r["id"].get<std::uint64_t>()] = r;
    if (r.contains("activity")) tensors.push_back(r);
    if (r.contains("timestamps")) ++stamps[r["id"].get<std::uint64_t>()];
  }
  ASSERT_EQ(models.size(), 2u) << j.dump();
  EXPECT_EQ(models[parent_id]["model_name"], "ens");
  EXPECT_FALSE(models[parent_id].contains("parent_id"));  // as Triton: only a child has one
  EXPECT_EQ(models[child_id]["model_name"], "step");
  EXPECT_EQ(models[child_id]["model_version"], 2);
  EXPECT_EQ(models[child_id]["parent_id"], parent_id);
  EXPECT_EQ(stamps[parent_id], 2);
  EXPECT_EQ(stamps[child_id], 2);
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors[0]["activity"], "TENSOR_QUEUE_INPUT");
  EXPECT_EQ(tensors[1]["activity"], "TENSOR_BACKEND_INPUT");
  for (const auto& t : tensors) {
    EXPECT_EQ(t["id"], child_id);
    EXPECT_EQ(
        t["tensor"],
        (nlohmann::json{{"name", "x"}, {"data", "1,-2,3"}, {"shape", "1,3"}, {"dtype", "INT32"}}));
  }
  std::filesystem::remove_all(dir);
}

TEST(Trace, TraceParentIsW3CTraceContext) {
  auto p = parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->trace_id[0], 0x0a);
  EXPECT_EQ(p->trace_id[15], 0x9c);
  EXPECT_EQ(p->span_id[7], 0x31);
  EXPECT_EQ(p->flags, 1);
  EXPECT_FALSE(parse_traceparent("00-00000000000000000000000000000000-b7ad6b7169203331-01"));
  EXPECT_FALSE(parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331"));
  EXPECT_FALSE(parse_traceparent("00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01"));
}

TEST(ServerConfig, IgnorableFieldsAreWarnings) {
  std::vector<std::string> warnings;
  auto p = plan(std::string(kIdentity) + R"(
optimization { graph { level: 1 } something_new { x: 1 } }
metric_tags { key: "a" value: "b" }
response_cache { enable: true }
output_extra_unknown_inside_cache_is_fine: 0
)",
                &warnings);
  // The last line is unknown at the top level: an error, naming it.
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("output_extra_unknown_inside_cache_is_fine"),
            std::string_view::npos);
  warnings.clear();
  p = plan(std::string(kIdentity) + R"(
optimization { graph { level: 1 } something_new { x: 1 } }
metric_tags { key: "a" value: "b" }
response_cache { enable: true }
)",
           &warnings);
  ASSERT_TRUE(p.ok()) << p.status();
  std::string all;
  for (const auto& w : warnings) all += w + "\n";
  EXPECT_NE(all.find("optimization is ignored"), std::string::npos) << all;
  EXPECT_NE(all.find("metric_tags is ignored"), std::string::npos) << all;
  // response_cache is served (response_cache.hpp), not ignored.
  EXPECT_EQ(all.find("response_cache"), std::string::npos) << all;
  EXPECT_TRUE(p->response_cache);
}

TEST(ServerConfig, BehaviourChangingFieldsAreErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {"sequence_batching { iterative_sequence: true }", "iterative_sequence"},
      {"sequence_batching { control_input [ { name: \"S\" control [ { kind: "
       "CONTROL_SEQUENCE_START } ] } ] }",
       "int32_false_true"},
      {"ensemble_scheduling { step [ { model_name: \"a\" model_version: -1 } ] }",
       "ensemble_scheduling"},
      {"dynamic_batching { default_queue_policy { timeout_action: DELAY } }", "DELAY"},
      {"dynamic_batching { priority_levels: 2 default_priority_level: 1 priority_queue_policy { "
       "key: 1 value { max_queue_size: 3 } } }",
       "priority_queue_policy"},
      {"dynamic_batching { preferred_batch_size: [ 9 ] }", "preferred_batch_size 9"},
      {"dynamic_batching { priority_levels: 2 }", "default_priority_level 0"},
      {"model_transaction_policy { decoupled: true } response_cache { enable: true }",
       "decoupled model"},
      {"instance_group [ { kind: KIND_CPU }, { kind: KIND_GPU } ]", "different devices"},
      {"instance_group [ { kind: KIND_GPU, gpus: [ 0, 1 ] } ]", "lists 2 GPUs"},
      {"instance_group [ { kind: KIND_MODEL } ]", "KIND_MODEL"},
      {"max_batch_size: -2", "specified multiple times"},
  };
  for (const auto& [extra, expect] : cases) {
    auto p = plan(std::string(kIdentity) + extra + "\n");
    ASSERT_FALSE(p.ok()) << extra;
    EXPECT_NE(p.status().message().find(expect), std::string_view::npos)
        << extra << " → " << p.status();
  }
  // KIND_MODEL with parameters "device": what GET .../config shows for a simulated device loads.
  auto model_kind = plan(std::string(kIdentity) +
                         "instance_group [ { kind: KIND_MODEL, count: 2 } ]\n"
                         "parameters { key: \"device\" value { string_value: \"sim\" } }\n");
  ASSERT_TRUE(model_kind.ok()) << model_kind.status();
  EXPECT_EQ(model_kind->device, "sim");
  EXPECT_EQ(model_kind->engine.workers, 2);
  // reshape is served (ReshapesAreCheckedWithTritonsRules), but not on an ensemble's tensors.
  auto reshape = plan(R"(name: "m" platform: "ensemble" max_batch_size: 4
input [ { name: "a" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]
output [ { name: "b" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "s" model_version: -1
  input_map { key: "x" value: "a" } output_map { key: "y" value: "b" } } ] })");
  ASSERT_FALSE(reshape.ok());
  EXPECT_NE(reshape.status().message().find("reshape on an ensemble's inputs or outputs is not "
                                            "supported"),
            std::string_view::npos)
      << reshape.status();
}

TEST(ServerConfig, DecoupledMustAgreeWithTheModel) {
  auto decoupled = plan(std::string(kIdentity) + "model_transaction_policy { decoupled: true }\n");
  ASSERT_TRUE(decoupled.ok()) << decoupled.status();
  EXPECT_TRUE(decoupled->decoupled);
  auto identity = load_model("builtin:identity?shape=16&max_batch=8");
  ASSERT_TRUE(identity.ok());
  Status s = check_signature(*decoupled, (*identity)->signature());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("one response per request"), std::string_view::npos) << s;

  auto plain = plan(R"(name: "m" backend: "builtin" max_batch_size: 8
parameters { key: "uri" value { string_value: "builtin:stream?n=2&max_batch=8" } })");
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto stream = load_model("builtin:stream?n=2&max_batch=8");
  ASSERT_TRUE(stream.ok());
  s = check_signature(*plain, (*stream)->signature());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model_transaction_policy { decoupled: true }"),
            std::string_view::npos)
      << s;
  plain->decoupled = true;
  EXPECT_TRUE(check_signature(*plain, (*stream)->signature()).ok());
}

// Ensembles: what check_ensemble_graph finds in the config alone, and what resolve_ensemble
// finds against the step models' signatures.
constexpr const char* kEnsembleHead = R"(name: "m" platform: "ensemble" max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Z" data_type: TYPE_FP32 dims: [ 4 ] } ]
)";

std::string ensemble(const std::string& steps) {
  return std::string(kEnsembleHead) + "ensemble_scheduling { step [ " + steps + " ] }\n";
}

std::string step(const std::string& model, const std::string& in, const std::string& from,
                 const std::string& out, const std::string& to) {
  return "{ model_name: \"" + model + "\" model_version: -1 input_map { key: \"" + in +
         "\" value: \"" + from + "\" } output_map { key: \"" + out + "\" value: \"" + to + "\" } }";
}

TEST(ServerConfig, EnsembleGraphErrorsNameTheStepAndTheTensor) {
  auto good =
      plan(ensemble(step("pre", "x", "A", "y", "T") + ", " + step("net", "x", "T", "y", "Z")));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->kind, ModelPlan::Kind::ensemble);
  EXPECT_EQ(good->platform, "ensemble");
  ASSERT_EQ(good->ensemble_steps.size(), 2U);
  EXPECT_EQ(good->ensemble_steps[1].input_map[0], (std::pair<std::string, std::string>("x", "T")));
  auto order = check_ensemble_graph(*good);
  ASSERT_TRUE(order.ok());
  EXPECT_EQ(*order, (std::vector<std::size_t>{0, 1}));

  auto expect_error = [](const std::string& text, const std::vector<std::string>& parts) {
    auto p = plan(text);
    ASSERT_FALSE(p.ok()) << text;
    for (const std::string& part : parts) {
      EXPECT_NE(p.status().message().find(part), std::string_view::npos)
          << p.status() << "\nexpected: " << part;
    }
  };
  expect_error(ensemble(step("pre", "x", "NOPE", "y", "Z")),
               {"step 0 (model 'pre') input 'x' reads tensor 'NOPE', which nothing produces"});
  expect_error(ensemble(step("pre", "x", "A", "y", "Z") + ", " + step("net", "x", "A", "y", "Z")),
               {"tensor 'Z' has two producers", "step 0 (model 'pre')",
                "step 1 (model 'net')'s output 'y'"});
  expect_error(ensemble(step("pre", "x", "A", "y", "A")),
               {"tensor 'A' has two producers: the ensemble's input"});
  expect_error(ensemble(step("p", "x", "U", "y", "T") + ", " + step("q", "x", "T", "y", "U") +
                        ", " + step("r", "x", "T", "y", "Z")),
               {"the steps form a cycle", "step 0 (model 'p') reads 'U' from step 1 (model 'q')",
                "step 1 (model 'q') reads 'T' from step 0 (model 'p')"});
  expect_error(ensemble(step("pre", "x", "A", "y", "T")),
               {"ensemble output 'Z' is not produced by any step"});
  expect_error(std::string(kEnsembleHead), {"needs ensemble_scheduling"});
  expect_error(std::string(kEnsembleHead) + "ensemble_scheduling { }\n", {"lists no step"});
  expect_error(R"(name: "m" backend: "builtin" max_batch_size: 8
parameters { key: "uri" value { string_value: "builtin:identity" } }
ensemble_scheduling { step [ { model_name: "x" } ] })",
               {"ensemble_scheduling needs platform: \"ensemble\""});
  expect_error(ensemble(step("pre", "x", "A", "y", "Z")) + "dynamic_batching { }\n",
               {"dynamic_batching\" is specified along with field \"ensemble_scheduling"});
}

TEST(ServerConfig, EnsembleResolvedAgainstItsStepModels) {
  auto p = plan(ensemble(step("pre", "x", "A", "y", "T") + ", " + step("net", "x", "T", "y", "Z")));
  ASSERT_TRUE(p.ok()) << p.status();
  auto spec = [](const char* name, DType dtype, Shape shape) {
    return TensorSpec{name, dtype, std::move(shape)};
  };
  std::map<std::string, ModelSignature> models;
  models["pre"] =
      ModelSignature{{spec("x", DType::f32, {-1, 4})}, {spec("y", DType::f32, {-1, 4})}};
  models["net"] =
      ModelSignature{{spec("x", DType::f32, {-1, -1})}, {spec("y", DType::f32, {-1, 4})}};
  auto lookup = [&](const EnsembleStep& s) -> Result<ModelSignature> {
    auto it = models.find(s.model_name);
    if (it == models.end()) return not_found_error("no model '" + s.model_name + "'");
    return it->second;
  };
  auto g = resolve_ensemble(*p, lookup);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ((*g)->steps.size(), 2U);
  EXPECT_EQ((*g)->steps[0].waits_for, 0U);
  EXPECT_EQ((*g)->steps[1].waits_for, 1U);
  ASSERT_EQ((*g)->steps[0].feeds.size(), 1U);
  EXPECT_EQ((*g)->steps[0].feeds[0], (std::pair<std::size_t, std::size_t>(1, 1)));

  auto expect_error = [&](const std::vector<std::string>& parts) {
    auto r = resolve_ensemble(*p, lookup);
    ASSERT_FALSE(r.ok());
    for (const std::string& part : parts) {
      EXPECT_NE(r.status().message().find(part), std::string_view::npos)
          << r.status() << "\nexpected: " << part;
    }
  };
  models["net"].inputs[0].dtype = DType::f16;
  expect_error({"tensor 'T': step 0 (model 'pre') output 'y' is FP32[-1,4]",
                "step 1 (model 'net') input 'x' expects FP16[-1,-1]"});
  models["net"].inputs[0] = spec("x", DType::f32, {-1, 5});
  expect_error({"tensor 'T'", "expects FP32[-1,5]"});
  models["net"].inputs[0] = spec("other", DType::f32, {-1, 4});
  expect_error(
      {"step 1 (model 'net') input_map names input 'x', which the model does not have "
       "(it has other)"});
  models["net"].inputs = {spec("x", DType::f32, {-1, 4}), spec("extra", DType::f32, {-1, 4})};
  expect_error({"step 1 (model 'net') input 'extra' is not in its input_map"});
  models["net"].inputs = {spec("x", DType::f32, {-1, 4})};
  models["net"].outputs[0] = spec("y", DType::i32, {-1, 4});
  expect_error(
      {"output 'Z' is listed as FP32[-1,4], but step 1 (model 'net') output 'y' is "
       "INT32[-1,4]"});
  models.erase("net");
  expect_error({"step 1 (model 'net'): no model 'net'"});
}

TEST(ServerConfig, BackendsAndNames) {
  auto torch = plan(R"(name: "m" platform: "pytorch_libtorch" max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_INT64 dims: [ -1 ] } ])");
  ASSERT_TRUE(torch.ok()) << torch.status();
  EXPECT_EQ(torch->kind, ModelPlan::Kind::file);
  EXPECT_EQ(torch->form.kind, "torch");
  EXPECT_EQ(torch->model_filename, "model.pt");
  EXPECT_EQ(torch->outputs[0].shape, (Shape{-1, -1}));
  auto no_io = plan(R"(name: "m" platform: "pytorch_libtorch")");
  ASSERT_FALSE(no_io.ok());
  EXPECT_NE(no_io.status().message().find("needs input and output"), std::string_view::npos);
  auto no_uri = plan(R"(name: "m" backend: "builtin")");
  ASSERT_FALSE(no_uri.ok());
  EXPECT_NE(no_uri.status().message().find("needs parameters { key: \"uri\""),
            std::string_view::npos);
  auto renamed = plan(R"(name: "other" backend: "builtin")");
  ASSERT_FALSE(renamed.ok());
  EXPECT_NE(renamed.status().message().find("differs from the model's folder"),
            std::string_view::npos);
  auto strings = plan(R"(name: "m" platform: "pytorch_libtorch"
input [ { name: "a" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "b" data_type: TYPE_FP32 dims: [ 1 ] } ])");
  // TYPE_STRING is BYTES (the TorchScript backend refuses it when the model loads).
  ASSERT_TRUE(strings.ok()) << strings.status().to_string();
  EXPECT_EQ(strings->inputs[0].dtype, DType::bytes);
}

TEST(ServerConfig, ANamelessBackendIsTheOneWhoseModelFileTheVersionFolderHolds) {
  // Triton's AutoCompleteBackendFields: a config (or a load's override) with neither platform nor
  // backend gets the backend whose default model file is in the first version folder.
  const std::string io = R"(max_batch_size: 4
input [ { name: "a" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "b" data_type: TYPE_FP32 dims: [ 2 ] } ])";
  std::vector<std::string> w;
  const std::vector<std::pair<std::string, std::string>> files = {{"model.py", "python"},
                                                                  {"model.pt", "pytorch"},
                                                                  {"model.onnx", "onnxruntime"},
                                                                  {"model.xml", "openvino"}};
  for (const auto& [file, backend] : files) {
    auto p = plan_model_config(io, "m/config.pbtxt", "m", &w, {"README.md", file});
    ASSERT_TRUE(p.ok()) << file << ": " << p.status();
    EXPECT_EQ(p->kind, ModelPlan::Kind::file);
    EXPECT_EQ(p->form.name, backend) << file;
    EXPECT_EQ(p->model_filename, file);
    auto json = plan_model_config_json(R"({"max_batch_size": 4, "input": [{"name": "a",
        "data_type": "TYPE_FP32", "dims": [2]}], "output": [{"name": "b", "data_type":
        "TYPE_FP32", "dims": [2]}]})",
                                       "the load's config parameter", "m", &w, {file});
    ASSERT_TRUE(json.ok()) << file << ": " << json.status();
    EXPECT_EQ(json->form.name, backend) << file;
  }
  // default_model_filename names the backend's file even where the folder does not hold it.
  auto named = plan_model_config(io + "\ndefault_model_filename: \"model.pt\"", "m/config.pbtxt",
                                 "m", &w, {"model.py"});
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->form.name, "pytorch");
  // A named backend is kept; a folder with no model file leaves the error as it was.
  auto given =
      plan_model_config(io + "\nbackend: \"python\"", "m/config.pbtxt", "m", &w, {"model.onnx"});
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->form.name, "python");
  auto none = plan_model_config(io, "m/config.pbtxt", "m", &w, {"README.md"});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("neither platform nor backend is set"),
            std::string_view::npos)
      << none.status();
}

TEST(ServerConfig, ReshapesAreCheckedWithTritonsRules) {
  auto with = [](const std::string& dims, const std::string& reshape, int max_batch = 8) {
    return plan("name: \"m\" backend: \"identity\" max_batch_size: " + std::to_string(max_batch) +
                "\ninput [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: " + dims +
                " reshape: { shape: " + reshape +
                " } } ]\noutput [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: " + dims + " } ]");
  };
  auto ok = with("[ 4 ]", "[ 2, 2 ]");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->inputs[0].shape, (Shape{-1, 4}));  // what clients send
  ASSERT_EQ(ok->input_reshapes.size(), 1u);
  EXPECT_EQ(ok->input_reshapes[0], (Shape{-1, 2, 2}));  // what the model takes
  EXPECT_EQ(ok->model_inputs()[0].shape, (Shape{-1, 2, 2}));
  EXPECT_TRUE(ok->output_reshapes.empty());
  auto variable = with("[ 2, 4, -1, 6 ]", "[ 8, -1, 1, 6 ]");  // Triton's own example
  ASSERT_TRUE(variable.ok()) << variable.status();
  auto scalar = with("[ 1 ]", "[ ]");
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(scalar->input_reshapes[0], (Shape{-1}));
  const std::vector<std::tuple<std::string, std::string, int, std::string>> bad = {
      {"[ 4 ]", "[ 3 ]", 8, "input 'INPUT0': has different size for dims and reshape"},
      {"[ 4 ]", "[ 0, 4 ]", 8, "reshape dimensions must be integer >= 1, or -1"},
      {"[ -1, 4 ]", "[ 4 ]", 8,
       "has different number of variable-size dimensions for dims and "
       "reshape"},
      {"[ 2, -1 ]", "[ -1, 2 ]", 8, "has different size for dims and reshape"},
      {"[ 1 ]", "[ ]", 0,
       "cannot have empty reshape for non-batching model as scalar tensors "
       "are not supported"}};
  for (const auto& [dims, reshape, max_batch, words] : bad) {
    auto p = with(dims, reshape, max_batch);
    ASSERT_FALSE(p.ok()) << dims << " -> " << reshape;
    EXPECT_NE(p.status().message().find(words), std::string_view::npos) << p.status();
  }
  // At run time a -1 of the reshape takes the size of the request's -1 at the same rank.
  EXPECT_EQ(resolve_reshape({-1, 2, 4, -1, 6}, {-1, 8, -1, 1, 6}, {3, 2, 4, 5, 6}),
            (Shape{3, 8, 5, 1, 6}));
  EXPECT_EQ(resolve_reshape({-1, 8, -1, 1, 6}, {-1, 2, 4, -1, 6}, {3, 8, 5, 1, 6}),
            (Shape{3, 2, 4, 5, 6}));
  EXPECT_EQ(resolve_reshape({-1, 1}, {-1}, {7, 1}), (Shape{7}));
}

// ---- a backend of the test's own ----------------------------------------------------------------

/// The test's backend "test_scale": its model file holds one number, k; output = k * input, FP32
/// of any shape. Registered with its repository form like any backend (src/backends.cpp does the
/// same for torch, openvino and python), then served by the server without a line of it knowing.
class ScaleModel final : public Model, public std::enable_shared_from_this<ScaleModel> {
 public:
  ScaleModel(float k, const ModelOptions& o) : k_(k) {
    sig_.inputs = o.inputs;
    sig_.outputs = o.outputs;
    sig_.batched = o.batched.value_or(true);
    sig_.batch_limit = o.batch_limit;
  }
  const ModelSignature& signature() const noexcept override { return sig_; }
  const std::string& name() const noexcept override { return name_; }
  Result<std::unique_ptr<ModelInstance>> create_instance(Device&, Stream&,
                                                         const InstanceOptions&) override {
    return std::unique_ptr<ModelInstance>(std::make_unique<Instance>(k_));
  }

 private:
  class Instance final : public ModelInstance {
   public:
    explicit Instance(float k) : k_(k) {}
    Status enqueue(Stream& stream, const std::shared_ptr<BatchIO>& io) override {
      auto out = Tensor::empty(DType::f32, io->host_inputs.at(0).shape());
      if (!out.ok()) return out.status();
      io->outputs = {*out};
      Kernel kernel;
      kernel.name = "scale";
      kernel.host_fn = [io, k = k_](std::stop_token) {
        const Tensor& in = io->host_inputs.at(0);
        for (std::size_t i = 0; i < in.numel(); ++i) {
          io->outputs[0].data_as<float>()[i] = k * in.data_as<float>()[i];
        }
        return Status();
      };
      return stream.enqueue(std::move(kernel));
    }

   private:
    float k_;
  };

  float k_;
  ModelSignature sig_;
  std::string name_ = "test_scale";
};

// What the backend's loader was handed, by model file (the parameters the server passes on); the
// repository loads its models at once.
std::mutex g_scale_mu;
std::map<std::string, BackendParameters> g_scale_parameters;

void register_scale_backend() {
  static const bool registered = [] {
    auto& registry = detail::ModelBackendRegistry::instance();
    detail::ModelBackend backend;
    backend.kind = "test_scale";
    backend.usage = "test_scale:<file holding k>";
    backend.takes_backend_parameters = true;
    backend.load = [](std::string_view, std::string_view file,
                      const ModelOptions& o) -> Result<std::shared_ptr<Model>> {
      float k = 0;
      if (!(std::ifstream(std::string(file)) >> k)) {
        return invalid_argument_error("test_scale: no number in " + std::string(file));
      }
      {
        std::lock_guard lock(g_scale_mu);
        g_scale_parameters[std::string(file)] = o.backend_parameters;
      }
      return std::shared_ptr<Model>(std::make_shared<ScaleModel>(k, o));
    };
    EXPECT_TRUE(registry.add(backend).ok());
    detail::RepositoryForm form;
    form.name = "test_scale";
    form.platforms = {"test_scale_text"};
    form.kind = "test_scale";
    form.default_model_filename = "model.txt";
    form.metadata_platform = "test_scale_text";
    form.config_backend = "test_scale";
    form.needs_config_tensors = true;
    form.takes_backend_parameters = true;
    form.batched_from_config = true;
    EXPECT_TRUE(registry.add_form(form).ok());
    return true;
  }();
  (void)registered;
}

TEST(ServerBackends, ABackendRegisteredWithItsFormIsServedFromARepository) {
  register_scale_backend();
  namespace fs = std::filesystem;
  const fs::path root =
      fs::temp_directory_path() / ("asyncinfer-test-scale-" + std::to_string(getpid()));
  fs::create_directories(root / "scale" / "1");
  std::ofstream(root / "scale" / "config.pbtxt") << R"(backend: "test_scale" max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
parameters { key: "unit" value { string_value: "metres" } })";
  std::ofstream(root / "scale" / "1" / "model.txt") << "2.5\n";
  // By its platform too; and without its tensors, which this form needs.
  fs::create_directories(root / "by_platform" / "1");
  std::ofstream(root / "by_platform" / "config.pbtxt") << R"(platform: "test_scale_text"
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ])";
  std::ofstream(root / "by_platform" / "1" / "model.txt") << "-1\n";
  fs::create_directories(root / "no_tensors" / "1");
  std::ofstream(root / "no_tensors" / "config.pbtxt") << R"(backend: "test_scale")";
  std::ofstream(root / "no_tensors" / "1" / "model.txt") << "1\n";

  auto repo = ModelRepository::load(root, [](const std::string&) {});
  ASSERT_TRUE(repo.ok()) << repo.status();
  InferenceServer server(std::move(*repo), ServerOptions{});
  auto model = server.find("scale", "");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->platform, "test_scale_text");
  {
    std::lock_guard lock(g_scale_mu);
    const BackendParameters& given =
        g_scale_parameters[(root / "scale" / "1" / "model.txt").string()];
    ASSERT_EQ(given.size(), 1u);
    EXPECT_EQ(given[0].first, "unit");
    EXPECT_EQ(given[0].second, "metres");
  }
  InferRequest request;
  request.inputs.push_back(
      {"INPUT0", *Tensor::from_values<float>({1, 4}, std::vector<float>{1, 2, 3, 4})});
  auto p = std::make_shared<std::promise<Result<InferResponse>>>();
  auto f = p->get_future();
  ASSERT_TRUE(server
                  .submit(*model, std::move(request),
                          [p](Result<InferResponse> r) { p->set_value(std::move(r)); })
                  .ok());
  ASSERT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  Result<InferResponse> r = f.get();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->outputs.size(), 1u);
  EXPECT_EQ(r->outputs[0].spec->name, "OUTPUT0");
  const Tensor& out = r->outputs[0].tensor;
  ASSERT_EQ(out.numel(), 4u);
  EXPECT_EQ((std::vector<float>(out.data_as<float>(), out.data_as<float>() + 4)),
            (std::vector<float>{2.5f, 5.0f, 7.5f, 10.0f}));

  auto unbatched = server.find("by_platform", "");
  ASSERT_TRUE(unbatched.ok()) << unbatched.status();
  EXPECT_FALSE(
      (*unbatched)->signature.batched);  // max_batch_size 0: Triton's rule, from the config
  auto missing = server.find("no_tensors", "");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("a test_scale_text model needs input and output lists"),
            std::string_view::npos)
      << missing.status();
  server.shutdown(ShutdownMode::drain, std::chrono::milliseconds(5000));
  std::error_code ec;
  fs::remove_all(root, ec);
}

TEST(ServerConfig, VersionPolicies) {
  VersionPolicy latest;
  EXPECT_EQ(latest.select({3, 1, 10}), (std::vector<std::int64_t>{10}));
  latest.num_versions = 2;
  EXPECT_EQ(latest.select({3, 1, 10}), (std::vector<std::int64_t>{3, 10}));
  VersionPolicy all{VersionPolicy::Kind::all};
  EXPECT_EQ(all.select({3, 1}), (std::vector<std::int64_t>{1, 3}));
  VersionPolicy specific{VersionPolicy::Kind::specific, 1, {1, 7}};
  EXPECT_EQ(specific.select({3, 1}), (std::vector<std::int64_t>{1}));
  EXPECT_TRUE(latest.select({}).empty());
}

TEST(ServerConfig, DatatypeNames) {
  for (DType d :
       {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i8, DType::u8, DType::i16,
        DType::u16, DType::i32, DType::u32, DType::i64, DType::u64, DType::boolean, DType::bytes}) {
    auto back = dtype_from_oip(oip_datatype(d));
    ASSERT_TRUE(back.ok()) << oip_datatype(d);
    EXPECT_EQ(*back, d);
  }
  EXPECT_EQ(oip_datatype(DType::bytes), "BYTES");
  auto bad = dtype_from_oip("STRING");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("BYTES"), std::string_view::npos);
}

TEST(ServerStatus, TableCoversEveryCode) {
  EXPECT_EQ(http_status(StatusCode::invalid_argument), 400);
  EXPECT_EQ(http_status(StatusCode::not_found), 404);
  EXPECT_EQ(http_status(StatusCode::unavailable), 503);
  EXPECT_EQ(http_status(StatusCode::resource_exhausted), 503);
  EXPECT_EQ(http_status(StatusCode::deadline_exceeded), 504);
  EXPECT_EQ(http_status(StatusCode::internal), 500);
  EXPECT_EQ(grpc_code(StatusCode::deadline_exceeded), 4);
  EXPECT_EQ(grpc_code(StatusCode::unavailable), 14);
  for (std::size_t i = 0; i < status_mappings().size(); ++i) {
    EXPECT_EQ(static_cast<std::size_t>(status_mappings()[i].code), i);  // enum order, none missing
  }
}

// ---- the HTTP codec over a model without an engine ------------------------------------------

ModelVersion two_input_model() {
  ModelVersion m;
  m.model_name = "two";
  m.version_text = "1";
  m.max_batch_size = 4;
  m.signature.batched = true;
  m.signature.batch_limit = 4;
  m.signature.inputs = {{"a", DType::f32, {-1, 3}}, {"b", DType::u8, {-1, 2}}};
  m.signature.outputs = {{"x", DType::f32, {-1, 3}}, {"y", DType::f16, {-1, 2}}};
  return m;
}

TEST(ServerCodec, DecodesJsonAndBinaryInputs) {
  const ModelVersion m = two_input_model();
  const std::string header =
      R"({"id":"r1","parameters":{"timeout":1000},"inputs":[)"
      R"({"name":"b","shape":[1,2],"datatype":"UINT8","parameters":{"binary_data_size":2}},)"
      R"({"name":"a","shape":[1,3],"datatype":"FP32","data":[[1,2.5,-3]]}],)"
      R"("outputs":[{"name":"y","parameters":{"binary_data":true}}]})";
  const std::string body = header + std::string("\x07\xff", 2);
  auto d = decode_infer_request(m, body, header.size(), 64);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->request.inputs.size(), 2u);
  EXPECT_EQ(d->request.id, "r1");
  const Tensor& b = d->request.inputs[0].tensor;
  EXPECT_EQ(b.dtype(), DType::u8);
  EXPECT_EQ(b.data_as<std::uint8_t>()[1], 255);
  const Tensor& a = d->request.inputs[1].tensor;
  EXPECT_EQ(a.data_as<float>()[1], 2.5f);
  ASSERT_EQ(d->output_binary.size(), 1u);
  EXPECT_TRUE(d->output_binary[0]);
  auto options = InferenceServer::request_options(d->request.parameters);
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->timeout, std::chrono::microseconds(1000));
}

TEST(ServerCodec, RefusesBeforeAllocating) {
  const ModelVersion m = two_input_model();
  auto expect = [&](const std::string& json, const char* what) {
    auto d = decode_infer_request(m, json, std::nullopt, 64);
    ASSERT_FALSE(d.ok()) << json;
    EXPECT_EQ(d.status().code(), StatusCode::invalid_argument);
    EXPECT_NE(d.status().message().find(what), std::string_view::npos) << d.status();
  };
  // A shape of 2^60 rows is refused by max_batch_size, never allocated.
  expect(R"({"inputs":[{"name":"a","shape":[1152921504606846976,3],"datatype":"FP32","data":[]}]})",
         "max_batch_size");
  expect(R"({"inputs":[{"name":"a","shape":[1,3],"datatype":"FP32","data":[1,2]}]})",
         "\"data\" has 2 elements, shape [1,3] needs 3");
  expect(R"({"inputs":[{"name":"b","shape":[1,2],"datatype":"UINT8","data":[1,256]}]})",
         "out of range for UINT8");
  expect(R"({"inputs":[{"name":"b","shape":[1,2],"datatype":"UINT8","data":[1,-1]}]})",
         "out of range for UINT8");
  expect(R"({"inputs":[{"name":"a","shape":[1,3],"datatype":"FP32","data":[1,2,3]}]})",
         "output 'y' is FP16, which has no JSON form");
  expect(std::string(200, '['), "nested deeper than 64");
}

// The SAX reader (issue 23): JSON objects are unordered, so "data" may come first; the parse
// stops at the first element past the declared count; fields given twice are refused.
TEST(ServerCodec, ReadsFieldsInAnyOrder) {
  const ModelVersion m = two_input_model();
  // "data" before name, datatype and shape: the second pass writes it.
  const std::string json =
      R"({"outputs":[{"name":"x"}],"inputs":[{"data":[[4,5,6],[7,8,9]],"shape":[2,3],)"
      R"("extra":{"deep":[1,[2,{"x":3}]]},"datatype":"FP32","name":"a"},)"
      R"({"name":"b","datatype":"UINT8","shape":[1,2],"data":[1,2]}],)"
      R"("parameters":{"binary_data_output":true},"unknown":[[[]]]})";
  auto d = decode_infer_request(m, json, std::nullopt, 64);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->request.inputs.size(), 2u);
  EXPECT_EQ(d->request.inputs[0].name, "a");
  const Tensor& a = d->request.inputs[0].tensor;
  ASSERT_EQ(a.shape(), (Shape{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(a.data_as<float>()[i], static_cast<float>(4 + i));
  EXPECT_EQ(d->request.inputs[1].tensor.data_as<std::uint8_t>()[1], 2);
  // The request's binary_data_output, read after "outputs", still applies to them.
  ASSERT_EQ(d->output_binary.size(), 1u);
  EXPECT_TRUE(d->output_binary[0]);
}

TEST(ServerCodec, StopsAtTheFirstElementPastTheCount) {
  const ModelVersion m = two_input_model();
  auto error = [&](const std::string& json) {
    auto d = decode_infer_request(m, json, std::nullopt, 64);
    EXPECT_FALSE(d.ok()) << json;
    return std::string(d.status().message());
  };
  // The fifth element is never converted: the fourth already ends the parse.
  EXPECT_EQ(
      error(R"({"inputs":[{"name":"a","shape":[1,3],"datatype":"FP32","data":[1,2,3,4,"x"]})"),
      "input 'a': \"data\" has more than 3 elements, shape [1,3] needs 3");
  // Nor is the rest of the body: it is not even well-formed JSON.
  EXPECT_EQ(error(R"({"inputs":[{"name":"a","shape":[1,3],"datatype":"FP32","data":[1,2,3,4,)"),
            "input 'a': \"data\" has more than 3 elements, shape [1,3] needs 3");
  // Deferred data is checked as strictly by the second pass.
  EXPECT_EQ(error(R"({"inputs":[{"data":[1,2],"name":"a","shape":[1,3],"datatype":"FP32"}]})"),
            "input 'a': \"data\" has 2 elements, shape [1,3] needs 3");
  EXPECT_EQ(error(R"({"inputs":[{"data":[1,true,3],"name":"a","shape":[1,3],"datatype":"FP32"}]})"),
            "input 'a': data element 1 is a boolean; FP32 needs a number");
  EXPECT_EQ(error(R"({"inputs":[{"name":"a","name":"b"}]})"), "input 'a': \"name\" is given twice");
  EXPECT_EQ(error(R"({"inputs":[{"name":"a","shape":[1,[3]]}]})"),
            "input 'a': shape dims must be integers, got an array");
  EXPECT_EQ(error(R"({"inputs":[{"name":"a","shape":[1,3],"datatype":"FP32","data":[1,{},3]}]})"),
            "input 'a': data element 1 is an object; FP32 needs a number");
  EXPECT_EQ(error(R"({"parameters":{"p":[1]},"inputs":[]})"),
            "request: parameter 'p' must be a string, a number or a boolean");
  EXPECT_EQ(error(R"([1,2])"), "the request body must be a JSON object");
  EXPECT_EQ(error(R"({"id":"x"})"), "\"inputs\" is missing");
  // Past what rounds to FLT_MAX.
  EXPECT_EQ(
      error(R"({"inputs":[{"name":"a","shape":[1,3],"datatype":"FP32","data":[0,0,3.5e38]}]})"),
      "input 'a': data element 2 is the number 3.5e38; out of range for FP32");
}

TEST(ServerCodec, AcceptsItsOwnShortestFltMax) {
  // The encoder writes FLT_MAX as 3.4028235e+38, which reads back as a double just above it; it
  // must decode again (found by a hostile review).
  const ModelVersion m = two_input_model();
  auto d = decode_infer_request(
      m,
      R"({"inputs":[{"name":"a","shape":[1,3],"datatype":"FP32","data":[3.4028235e+38,-3.4028235e38,1]}],"outputs":[{"name":"x"}]})",
      std::nullopt, 64);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->request.inputs[0].tensor.data_as<float>()[0], std::numeric_limits<float>::max());
  EXPECT_EQ(d->request.inputs[0].tensor.data_as<float>()[1], -std::numeric_limits<float>::max());
}

TEST(ServerCodec, EncodesShortestFloatsAndBinaryOutputs) {
  auto owned = std::make_shared<ModelVersion>(two_input_model());
  const ModelVersion& m = *owned;
  DecodedInfer request;
  request.request.outputs = {{"x", {}}, {"y", {}}};
  request.output_binary = {false, true};
  InferResponse response;
  response.model = owned;
  response.id = "q\"1";
  auto x = Tensor::from_values<float>({1, 3}, std::vector<float>{0.1f, -2.f, 1e-30f});
  auto y = Tensor::zeros(DType::f16, {1, 2});
  response.outputs = {{&m.signature.outputs[0], *x, 0}, {&m.signature.outputs[1], *y, 1}};
  EncodedResponse enc = encode_infer_response(response, request);
  EXPECT_TRUE(enc.binary);
  EXPECT_EQ(
      enc.body.substr(0, enc.json_size),
      R"({"model_name":"two","model_version":"1","id":"q\"1","outputs":[)"
      R"({"name":"x","datatype":"FP32","shape":[1,3],"data":[0.1,-2,1e-30]},)"
      R"({"name":"y","datatype":"FP16","shape":[1,2],"parameters":{"binary_data_size":4}}]})");
  EXPECT_EQ(enc.body.size(), enc.json_size + 4);
}

// ---- limits (issue 23)
// ---------------------------------------------------------------------------

// ---- the response cache -------------------------------------------------------------------

std::vector<Tensor> one_output(float v, std::size_t n = 16) {
  return {*Tensor::from_values<float>({static_cast<std::int64_t>(n)}, std::vector<float>(n, v))};
}

CacheKey key_of(float v) {
  std::vector<Tensor> in = one_output(v);
  return response_cache_key("m", 1, in);
}

TEST(ResponseCache, KeysFollowModelVersionDtypeShapeAndBytes) {
  std::vector<Tensor> a = one_output(1), b = one_output(1), c = one_output(2);
  EXPECT_EQ(response_cache_key("m", 1, a), response_cache_key("m", 1, b));
  EXPECT_NE(response_cache_key("m", 1, a), response_cache_key("m", 1, c));
  EXPECT_NE(response_cache_key("m", 1, a), response_cache_key("m", 2, a));
  EXPECT_NE(response_cache_key("m", 1, a), response_cache_key("n", 1, a));
  std::vector<Tensor> reshaped = {*a[0].reshape({2, 8})};
  EXPECT_NE(response_cache_key("m", 1, a), response_cache_key("m", 1, reshaped));
}

TEST(ResponseCache, HitsCopiesAndEvictsTheLeastRecentlyUsed) {
  ResponseCache::Waiter none;
  // Room for three entries of 64 bytes with their keys and bookkeeping (about 750 bytes each).
  ResponseCache cache(3 * 800);
  for (float v : {1.f, 2.f, 3.f}) {
    auto l = cache.lookup(key_of(v), false, none);
    EXPECT_EQ(l.role, ResponseCache::Role::alone);
    std::vector<Tensor> out = one_output(v * 10);
    cache.finish(key_of(v), false, out);
    out[0].data_as<float>()[0] = -1;  // the entry is a copy: a reused buffer does not change it
  }
  EXPECT_EQ(cache.entries(), 3u);
  auto hit = cache.lookup(key_of(1), false, none);  // 1 becomes the most recent
  ASSERT_EQ(hit.role, ResponseCache::Role::hit);
  EXPECT_EQ(hit.outputs[0].data_as<float>()[0], 10.f);
  cache.finish(key_of(4), false, one_output(40));  // evicts 2, the least recent
  EXPECT_EQ(cache.lookup(key_of(2), false, none).role, ResponseCache::Role::alone);
  EXPECT_EQ(cache.lookup(key_of(1), false, none).role, ResponseCache::Role::hit);
  EXPECT_EQ(cache.evictions(), 1u);
  EXPECT_LE(cache.bytes(), cache.capacity());
  // An entry larger than the cache is not kept, and evicts nothing.
  cache.finish(key_of(5), false, one_output(5, 4096));
  EXPECT_EQ(cache.lookup(key_of(5), false, none).role, ResponseCache::Role::alone);
  EXPECT_EQ(cache.evictions(), 1u);
  // A failure is not kept.
  cache.finish(key_of(6), false, Result<std::vector<Tensor>>(unavailable_error("x")));
  EXPECT_EQ(cache.lookup(key_of(6), false, none).role, ResponseCache::Role::alone);
}

TEST(ResponseCache, FollowersGetTheLeadersResultOnceAndMayWithdraw) {
  ResponseCache cache(1 << 20);
  ResponseCache::Waiter none;
  const CacheKey k = key_of(7);
  ASSERT_EQ(cache.lookup(k, true, none).role, ResponseCache::Role::leader);
  std::vector<int> called(3, 0);
  std::vector<std::uint64_t> tickets;
  for (int i = 0; i < 3; ++i) {
    ResponseCache::Waiter w = [&called, i](const Result<std::vector<Tensor>>& r) {
      EXPECT_TRUE(r.ok());
      ++called[i];
    };
    auto l = cache.lookup(k, true, w);
    ASSERT_EQ(l.role, ResponseCache::Role::follower);
    tickets.push_back(l.ticket);
  }
  EXPECT_TRUE(cache.withdraw(k, tickets[1]));
  EXPECT_FALSE(cache.withdraw(k, tickets[1]));
  const Result<std::vector<Tensor>> seventy = one_output(70);
  std::vector<ResponseCache::Waiter> followers = cache.finish(k, true, seventy);
  EXPECT_EQ(called, (std::vector<int>{0, 0, 0}));  // the caller calls them
  ASSERT_EQ(followers.size(), 2u);
  for (auto& w : followers) w(seventy);
  EXPECT_EQ(called, (std::vector<int>{1, 0, 1}));
  EXPECT_FALSE(cache.withdraw(k, tickets[0]));  // called already
  EXPECT_EQ(cache.lookup(k, true, none).role, ResponseCache::Role::hit);
  // A failed leader's followers hear the failure (and run on their own, inference_server.cpp);
  // the next request leads a new flight.
  const CacheKey f = key_of(8);
  ASSERT_EQ(cache.lookup(f, true, none).role, ResponseCache::Role::leader);
  bool failed = false;
  ResponseCache::Waiter w = [&failed](const Result<std::vector<Tensor>>& r) { failed = !r.ok(); };
  ASSERT_EQ(cache.lookup(f, true, w).role, ResponseCache::Role::follower);
  const Result<std::vector<Tensor>> gone = cancelled_error("gone");
  for (auto& follower : cache.finish(f, true, gone)) follower(gone);
  EXPECT_TRUE(failed);
  EXPECT_EQ(cache.lookup(f, true, none).role, ResponseCache::Role::leader);
}

TEST(ResponseCache, CacheConfigIsTritons) {
  std::vector<std::string> v = {"local,size=1048576"};
  EXPECT_EQ(*parse_cache_config(v), 1048576u);
  v = {"local,size=10", "local,size=20"};  // later ones win
  EXPECT_EQ(*parse_cache_config(v), 20u);
  EXPECT_EQ(*parse_cache_config({}), 0u);
  for (const char* bad : {"redis,host=localhost", "local", "local,size=", "local,size=-1",
                          "local,size=1e6", "local,count=3", "local,size=10,x=1"}) {
    std::vector<std::string> b = {bad};
    auto r = parse_cache_config(b);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::invalid_argument) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string_view::npos) << r.status();
  }
}

TEST(ServerLimits, MemoryBudgetRefusesPastItsLimitAndReturnsOnRelease) {
  MemoryBudget budget(1000);
  auto a = budget.lease();
  EXPECT_TRUE(a.reserve(600));
  auto b = budget.lease();
  EXPECT_FALSE(b.reserve(500));  // 600 + 500 > 1000: nothing taken
  EXPECT_EQ(b.bytes(), 0u);
  EXPECT_EQ(budget.used(), 600u);
  EXPECT_TRUE(b.reserve(400));
  b.hold(700);  // bytes already in memory are counted, never refused
  EXPECT_EQ(budget.used(), 1300u);
  EXPECT_FALSE(a.reserve(601));
  EXPECT_TRUE(a.reserve(100));  // shrinking always succeeds
  {
    auto moved = std::move(b);
    EXPECT_EQ(moved.bytes(), 700u);
  }  // released when the lease that holds it goes
  EXPECT_EQ(budget.used(), 100u);
  a.release();
  EXPECT_EQ(budget.used(), 0u);
  EXPECT_NE(budget.exhausted_message(5).find("--max-inflight-bytes"), std::string::npos);
}

TEST(ServerLimits, MemoryBudgetUnderContentionNeverPassesItsLimit) {
  MemoryBudget budget(64);
  std::atomic<bool> over{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        auto l = budget.lease();
        if (l.reserve(16) && budget.used() > 64) over = true;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(over.load());
  EXPECT_EQ(budget.used(), 0u);
}

TEST(ServerLimits, ConnectionBudgetWakesArmedSubscribersOnRelease) {
  ConnectionBudget budget(3);
  EXPECT_TRUE(budget.try_acquire(2));
  EXPECT_FALSE(budget.try_acquire(2));
  int woken = 0;
  const std::size_t id = budget.subscribe([&] { ++woken; });
  budget.release(0);
  EXPECT_EQ(woken, 0);  // not armed
  budget.arm(id);
  budget.arm(id);
  budget.release(2);
  EXPECT_EQ(woken, 1);
  budget.release(0);
  EXPECT_EQ(woken, 1);  // once per arm
  budget.arm(id);
  budget.unsubscribe(id);
  budget.release(0);
  EXPECT_EQ(woken, 1);  // never after unsubscribe
  EXPECT_TRUE(budget.try_acquire(3));
  ConnectionBudget unlimited(0);
  EXPECT_TRUE(unlimited.try_acquire(1u << 20));
}

TEST(ServerLimits, ListenerHealthNamesEachFailingListener) {
  ListenerHealth health;
  int changes = 0;
  health.on_change([&] { ++changes; });
  EXPECT_TRUE(health.all_accepting());
  EXPECT_TRUE(health.set_failing("grpc", "at its connection limit"));
  EXPECT_FALSE(health.set_failing("grpc", "still at it"));  // not a change
  EXPECT_TRUE(health.set_failing("http", "accept() failed: Too many open files"));
  EXPECT_FALSE(health.all_accepting());
  EXPECT_EQ(health.reasons(), "grpc: still at it; http: accept() failed: Too many open files");
  EXPECT_TRUE(health.set_accepting("grpc"));
  EXPECT_FALSE(health.set_accepting("grpc"));
  EXPECT_TRUE(health.set_accepting("http"));
  EXPECT_TRUE(health.all_accepting());
  EXPECT_EQ(changes, 4);
}

TEST(ServerLimits, TheEndOfADescriptorShortageIsAnnouncedWithoutAnyoneAsking) {
  // accept() failed for want of descriptors; they come back (here: this process has plenty) with
  // nobody asking for readiness, as with a gRPC Watch client that sees NOT_SERVING. The
  // descriptor watch finds out and tells the observers; a second shortage starts it again.
  ListenerHealth health;
  std::atomic<int> changes{0};
  health.on_change([&] { ++changes; });
  auto recovered_within = [&](int want_changes) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while ((!health.all_accepting() || changes.load() < want_changes) &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return health.all_accepting() && changes.load() == want_changes;
  };
  EXPECT_TRUE(health.set_failing("grpc", "accept() failed: Too many open files", true));
  EXPECT_TRUE(recovered_within(2));
  EXPECT_TRUE(health.set_failing("http", "accept() failed: Too many open files", true));
  EXPECT_TRUE(recovered_within(4));
  // A failure of another kind is not the watch's: it stands until the listener accepts.
  EXPECT_TRUE(health.set_failing("grpc", "at its connection limit"));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_FALSE(health.all_accepting());
}

// ---- model control -----------------------------------------------------------------------------

namespace fs = std::filesystem;

/// A repository folder with model "identity" (version 1, builtin), removed at the end.
class ControlRepo {
 public:
  ControlRepo() {
    static std::atomic<int> n{0};
    root_ = fs::temp_directory_path() /
            ("asyncinfer-control-" + std::to_string(getpid()) + "-" + std::to_string(n++));
    fs::create_directories(root_ / "identity" / "1");
    std::ofstream(root_ / "identity" / "config.pbtxt") << config(0);
  }
  ~ControlRepo() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  static std::string config(int delay_us) {
    std::string text = kIdentity;
    text.replace(text.find("name: \"m\""), 9, "name: \"identity\"");
    return text + "dynamic_batching { max_queue_delay_microseconds: " + std::to_string(delay_us) +
           " }\n";
  }
  const fs::path& root() const { return root_; }

 private:
  fs::path root_;
};

/// Runs a control call and waits for its outcome (at most 30 s).
Status control(const std::function<void(ModelRepository::Done)>& call) {
  auto p = std::make_shared<std::promise<Status>>();
  std::future<Status> f = p->get_future();
  call([p](const Status& s) { p->set_value(s); });
  if (f.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    return deadline_exceeded_error("the control call did not finish within 30 s");
  }
  return f.get();
}

std::unique_ptr<InferenceServer> explicit_server(const ControlRepo& repo,
                                                 std::vector<std::string> load = {"identity"}) {
  RepositoryOptions o;
  o.control_mode = ModelControlMode::explicit_mode;
  o.load_models = std::move(load);
  o.drain_timeout = std::chrono::milliseconds(5000);
  auto r = ModelRepository::load(
      repo.root(), [](const std::string&) {}, o);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return nullptr;
  return std::make_unique<InferenceServer>(std::move(*r), ServerOptions{});
}

/// Submits one [1,16] request to `model` and waits for its answer.
Result<InferResponse> infer(InferenceServer& server, const ModelRef& model, float value) {
  InferRequest request;
  request.inputs.push_back(
      {"input0", *Tensor::from_values<float>({1, 16}, std::vector<float>(16, value))});
  auto p = std::make_shared<std::promise<Result<InferResponse>>>();
  std::future<Result<InferResponse>> f = p->get_future();
  auto accepted =
      server.submit(model, std::move(request), [p](Result<InferResponse> r) { p->set_value(r); });
  if (!accepted.ok()) return accepted.status();
  if (f.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    return deadline_exceeded_error("no answer within 30 s");
  }
  return f.get();
}

IndexEntry entry(const ModelRepository& repo, const std::string& name, const std::string& version) {
  for (IndexEntry& e : repo.snapshot()->index(false)) {
    if (e.name == name && e.version == version) return e;
  }
  return {name, version, ModelState::unavailable, "(no index entry)"};
}

TEST(ModelControl, ModesAreTritons) {
  EXPECT_EQ(*parse_model_control_mode("explicit"), ModelControlMode::explicit_mode);
  EXPECT_EQ(*parse_model_control_mode("poll"), ModelControlMode::poll);
  auto bad = parse_model_control_mode("manual");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("expected none, poll or explicit"), std::string::npos);
  ControlRepo repo;
  auto r = ModelRepository::load(repo.root(), [](const std::string&) {});
  ASSERT_TRUE(r.ok()) << r.status();
  Status s = control([&](auto done) { (*r)->load_model("identity", std::nullopt, done); });
  EXPECT_EQ(s.code(), StatusCode::unavailable) << s;
  EXPECT_NE(s.message().find("--model-control-mode none"), std::string::npos) << s;
  RepositoryOptions o;
  o.control_mode = ModelControlMode::explicit_mode;
  o.load_models = {"missing"};
  auto missing = ModelRepository::load(
      repo.root(), [](const std::string&) {}, o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--load-model 'missing'"), std::string::npos);
}

TEST(ModelControl, ARequestForAReplacedVersionGoesToTheOneThatReplacedIt) {
  ControlRepo repo;
  auto server = explicit_server(repo);
  ASSERT_TRUE(server);
  auto old = server->find("identity", "");
  ASSERT_TRUE(old.ok()) << old.status();
  // A changed config on disk: the reload builds a new version beside the old one.
  std::ofstream(repo.root() / "identity" / "config.pbtxt") << ControlRepo::config(10);
  ASSERT_TRUE(control([&](auto done) {
                server->repository().load_model("identity", std::nullopt, done);
              }).ok());
  auto now = server->find("identity", "");
  ASSERT_TRUE(now.ok());
  EXPECT_NE(*now, *old);
  EXPECT_TRUE((*old)->retired.load());
  EXPECT_NE((*now)->generation, (*old)->generation);
  // A request that found the old version before the swap is answered by the new one.
  auto r = infer(*server, *old, 2.5f);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, *now);
  EXPECT_EQ(r->outputs[0].tensor.data_as<float>()[15], 2.5f);
  // The old version's engine drains and stops; it stays whole while `old` holds it.
  for (int i = 0; i < 500 && (*old)->engine->health().ready; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE((*old)->engine->health().ready);
  r = infer(*server, *old, 3.0f);  // after its engine stopped: sent on as well
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, *now);
  // An unchanged model is not reloaded.
  ASSERT_TRUE(control([&](auto done) {
                server->repository().load_model("identity", std::nullopt, done);
              }).ok());
  EXPECT_EQ(*server->find("identity", ""), *now);
}

TEST(ModelControl, ABadConfigLeavesTheOldVersionServing) {
  ControlRepo repo;
  auto server = explicit_server(repo);
  ASSERT_TRUE(server);
  auto old = server->find("identity", "1");
  ASSERT_TRUE(old.ok());
  Status s = control([&](auto done) {
    server->repository().load_model("identity", std::string(R"({"max_batch_size": "x"})"), done);
  });
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s;
  EXPECT_EQ(*server->find("identity", "1"), *old);
  EXPECT_FALSE((*old)->retired.load());
  IndexEntry e = entry(server->repository(), "identity", "1");
  EXPECT_EQ(e.state, ModelState::ready);
  EXPECT_NE(e.reason.find("the last load failed"), std::string::npos) << e.reason;
  EXPECT_TRUE(infer(*server, *old, 1.0f).ok());
  // A model with no folder: internal (Triton's 500), and nothing enters the index.
  s = control([&](auto done) { server->repository().load_model("nope", std::nullopt, done); });
  EXPECT_EQ(s.code(), StatusCode::internal) << s;
  EXPECT_EQ(server->repository().snapshot()->find("nope"), nullptr);
  EXPECT_TRUE(server->ready());
}

TEST(ModelControl, UnloadRefusesNewRequestsAndTheIndexFollowsIt) {
  ControlRepo repo;
  auto server = explicit_server(repo, {});
  ASSERT_TRUE(server);
  EXPECT_EQ(server->find("identity", "").status().code(), StatusCode::not_found);
  EXPECT_TRUE(server->ready());  // a model not asked for does not hold readiness back
  EXPECT_EQ(entry(server->repository(), "identity", "").state, ModelState::unavailable);
  ASSERT_TRUE(control([&](auto done) {
                server->repository().load_model("identity", std::nullopt, done);
              }).ok());
  auto v = server->find("identity", "");
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_TRUE(
      control([&](auto done) { server->repository().unload_model("identity", done); }).ok());
  auto gone = server->find("identity", "");
  EXPECT_EQ(gone.status().code(), StatusCode::not_found) << gone.status();
  // One that found it before the unload is refused too (nothing replaced it).
  auto late = infer(*server, *v, 1.0f);
  EXPECT_EQ(late.status().code(), StatusCode::not_found) << late.status();
  for (int i = 0; i < 500 && entry(server->repository(), "identity", "1").reason != "unloaded";
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(entry(server->repository(), "identity", "1").reason, "unloaded");
  Status s = control([&](auto done) { server->repository().unload_model("other", done); });
  EXPECT_EQ(s.code(), StatusCode::not_found) << s;
}

}  // namespace
}  // namespace asyncinfer::server

// ---- System shared memory (Triton's extension): the manager alone -------------------------------

namespace asyncinfer::server {
namespace {

/// A POSIX shared memory object of `size` bytes, unlinked at the end of the test.
class ShmObject {
 public:
  explicit ShmObject(std::size_t size)
      : key_("/asyncinfer-unit-" + std::to_string(::getpid()) + "-" + std::to_string(next_++)) {
    const int fd = ::shm_open(key_.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
    ::close(fd);
  }
  ~ShmObject() { ::shm_unlink(key_.c_str()); }
  const std::string& key() const { return key_; }

 private:
  static inline int next_ = 0;
  std::string key_;
};

TEST(SharedMemory, RegisterChecksNameKeyAndWindow) {
  ShmObject obj(8192);
  SharedMemoryManager m(nullptr, 0);
  ASSERT_TRUE(m.register_region("r", obj.key(), 4100, 64).ok());  // an offset off the page
  EXPECT_EQ(m.register_region("r", obj.key(), 0, 8).code(), StatusCode::already_exists);
  EXPECT_EQ(m.register_region("x", "/asyncinfer-no-such-key", 0, 8).code(), StatusCode::internal);
  EXPECT_EQ(m.register_region("x", obj.key(), 8000, 193).code(), StatusCode::invalid_argument);
  EXPECT_EQ(m.register_region("x", obj.key(), 0, 0).code(), StatusCode::invalid_argument);
  EXPECT_EQ(m.register_region("", obj.key(), 0, 8).code(), StatusCode::invalid_argument);
  auto all = m.status("");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0]->offset(), 4100u);
  EXPECT_EQ(m.status("x").status().code(), StatusCode::invalid_argument);
  // A tensor's window inside the region: offset + size within its 64 bytes.
  EXPECT_TRUE(m.window({"r", 64, 0}, "input 'a'").ok());
  auto far = m.window({"r", 60, 8}, "input 'a'");
  EXPECT_EQ(far.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(far.status().message().find("beyond the 64 bytes"), std::string_view::npos);
  EXPECT_EQ(m.window({"nope", 4, 0}, "input 'a'").status().code(), StatusCode::invalid_argument);
}

TEST(SharedMemory, RegistrationsAreCappedAndHoldOneDescriptorEach) {
  ShmObject obj(4096);
  SharedMemoryManager m(nullptr, 3);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(m.register_region("r" + std::to_string(i), obj.key(), 0, 8).ok());
  }
  Status over = m.register_region("r3", obj.key(), 0, 8);
  EXPECT_EQ(over.code(), StatusCode::resource_exhausted);
  EXPECT_NE(over.message().find("--max-shm-regions 3"), std::string_view::npos) << over.message();
  m.unregister("r0");
  EXPECT_TRUE(m.register_region("r3", obj.key(), 0, 8).ok());
}

// Inputs are copied out of the region when the request is decoded (shared_memory.hpp says why):
// what the client writes afterwards, or an object it shrinks, changes nothing the request holds.
TEST(SharedMemory, TensorsAreCopiesCountedAgainstTheBudget) {
  ShmObject obj(4096);
  MemoryBudget budget(1024);
  SharedMemoryManager m(&budget, 0);
  ASSERT_TRUE(m.register_region("in", obj.key(), 0, 4096).ok());
  auto region = m.find("in");
  ASSERT_TRUE(region.ok());
  const float values[4] = {1.5F, -2.0F, 3.25F, 4.0F};
  ASSERT_TRUE((*region)->write(16, values, sizeof values, "output 'y'").ok());
  auto t = m.read_tensor(*region, {"in", 16, 16}, DType::f32, {1, 4}, "input 'x'");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(budget.used(), 16u);  // the copy is counted while it lives
  {
    // ... by its own lease: a frontend's count of the request's tensors leaves it out.
    InferRequest req;
    req.inputs.push_back({"from_shm", *t, /*counted=*/true});
    req.inputs.push_back({"from_body", *t});
    EXPECT_EQ(input_bytes(req), 16u);
  }
  const float other[4] = {9, 9, 9, 9};
  ASSERT_TRUE((*region)->write(16, other, sizeof other, "output 'y'").ok());
  EXPECT_EQ(t->data_as<float>()[2], 3.25F);  // the client's later write is not seen
  region = Result<SharedMemoryRef>(internal_error("dropped"));
  m.unregister("in");
  EXPECT_TRUE(m.status("").value().empty());
  EXPECT_EQ(t->data_as<float>()[2], 3.25F);
  t = Result<Tensor>(internal_error("dropped"));
  EXPECT_EQ(budget.used(), 0u);
  ASSERT_TRUE(m.register_region("in", obj.key(), 0, 4096).ok());  // the name is free at once
  // Past the budget: refused before anything is read.
  auto r2 = m.find("in").value();
  auto big = m.read_tensor(r2, {"in", 2048, 0}, DType::u8, {2048}, "input 'x'");
  EXPECT_EQ(big.status().code(), StatusCode::resource_exhausted);
  EXPECT_NE(big.status().message().find("--max-inflight-bytes"), std::string_view::npos);
  // A size that disagrees with the shape; BYTES must fill its window exactly.
  EXPECT_EQ(m.read_tensor(r2, {"in", 12, 0}, DType::f32, {1, 4}, "input 'x'").status().code(),
            StatusCode::invalid_argument);
  std::string two;
  append_serialized_element(two, "ab");
  append_serialized_element(two, "");
  ASSERT_TRUE(r2->write(0, two.data(), two.size(), "output 's'").ok());
  auto b = m.read_tensor(r2, {"in", two.size(), 0}, DType::bytes, {2}, "input 's'");
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->string_elements().value()[0], "ab");
  EXPECT_FALSE(m.read_tensor(r2, {"in", two.size() + 3, 0}, DType::bytes, {2}, "s").ok());
}

// A client that shrinks its object below its window: reads and writes fail with the reason (a
// mapping would have been SIGBUS), and nothing grows the object back.
TEST(SharedMemory, AShrunkObjectFailsReadsAndWritesWithoutGrowingIt) {
  ShmObject obj(4096);
  SharedMemoryManager m(nullptr, 0);
  ASSERT_TRUE(m.register_region("r", obj.key(), 128, 64).ok());
  const int fd = ::shm_open(obj.key().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 100), 0);
  auto region = m.find("r").value();
  auto t = m.read_tensor(region, {"r", 16, 0}, DType::f32, {4}, "input 'x'");
  EXPECT_EQ(t.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(t.status().message().find("now holds 100 bytes (it was shrunk after registration)"),
            std::string_view::npos)
      << t.status().message();
  const char bytes[16] = {};
  Status w = region->write(0, bytes, sizeof bytes, "output 'y'");
  EXPECT_EQ(w.code(), StatusCode::invalid_argument);
  EXPECT_NE(w.message().find("output 'y'"), std::string_view::npos);
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_EQ(st.st_size, 100);
  ASSERT_EQ(::ftruncate(fd, 4096), 0);  // grown again by its owner: served again
  EXPECT_TRUE(region->write(0, bytes, sizeof bytes, "output 'y'").ok());
  EXPECT_TRUE(m.read_tensor(region, {"r", 16, 0}, DType::f32, {4}, "input 'x'").ok());
  ::close(fd);
}

}  // namespace
}  // namespace asyncinfer::server

// A client's RST_STREAM for its own expired deadline does not count toward --grpc-max-resets.
// gRPC's C core rounds the grpc-timeout header up to about three significant digits, so for
// deadlines over 100 s the server's deadline came up to a second (ten over 1,000 s) after the
// client's, and such cancellations were counted as resets (a connection with
// --grpc-max-resets 1 was closed by three calls with a 100.5 s deadline).
TEST(GrpcAcceptor, CancelledByDeadlineAllowsForTransitAndTimeoutRounding) {
  using std::chrono::milliseconds;
  using std::chrono::seconds;
  using std::chrono::system_clock;
  const system_clock::time_point t0 = system_clock::now();
  const auto by_deadline = [&](system_clock::duration sent, system_clock::duration at) {
    return asyncinfer::server::GrpcAcceptor::cancelled_by_deadline(t0 + sent, t0, t0 + at);
  };
  EXPECT_FALSE(asyncinfer::server::GrpcAcceptor::cancelled_by_deadline(
      system_clock::time_point::max(), t0, t0 + seconds(1)));
  EXPECT_TRUE(by_deadline(seconds(5), seconds(6)));          // past it
  EXPECT_TRUE(by_deadline(seconds(5), milliseconds(4950)));  // within the 100 ms of transit
  EXPECT_FALSE(by_deadline(seconds(5), seconds(4)));         // the client gave up a second early
  EXPECT_TRUE(by_deadline(seconds(101), milliseconds(100500)));    // 100.5 s sent as 101 s
  EXPECT_TRUE(by_deadline(seconds(1010), milliseconds(1000500)));  // 1,000.5 s sent as 1,010 s
  EXPECT_FALSE(by_deadline(seconds(101), seconds(50)));
  EXPECT_FALSE(by_deadline(seconds(1010), seconds(900)));
}
