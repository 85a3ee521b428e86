// Article §3.1 — a request queue with ids and a result store.
//
// The article polls get_result every 10 ms and keeps every result forever. Here result(id)
// blocks on a condition until the request ends (no polling), the store is bounded (capacity)
// and finished entries expire (TTL), and a duplicate live id is refused.
#include <cstdio>

#include "asyncinfer/asyncinfer.hpp"

using namespace asyncinfer;
using namespace std::chrono_literals;

int main() {
  EngineOptions options;
  options.queue_capacity = 100;  // max_queue_size=100
  options.result_store_capacity = 1000;
  options.result_ttl = 60s;
  auto engine = Engine::create(*load_model("builtin:fixed_cost?base_us=5000&shape=8"),
                               *open_device("sim"), options);
  if (!engine.ok()) return std::fprintf(stderr, "%s\n", engine.status().to_string().c_str()), 1;
  Engine& e = **engine;
  Status s = e.submit("req_001", {*Tensor::zeros(DType::f32, {1, 8})});
  std::printf("submit req_001: %s; status %s\n", s.to_string().c_str(),
              std::string(to_string(e.status("req_001"))).c_str());
  Status dup = e.submit("req_001", {*Tensor::zeros(DType::f32, {1, 8})});
  std::printf("submit req_001 again: %s\n", dup.to_string().c_str());
  // ... process other tasks ...
  auto result = e.result("req_001", 10s);  // get_result(request_id, timeout=10.0), no polling
  std::printf("result req_001: %s, status %s\n",
              result.ok() ? shape_to_string((*result)[0].shape()).c_str()
                          : result.status().to_string().c_str(),
              std::string(to_string(e.status("req_001"))).c_str());
  auto unknown = e.result("req_404", 10ms);
  std::printf("result req_404: %s\n", unknown.status().to_string().c_str());
  e.shutdown();  // stop(): drains, wakes every waiter, joins every thread
  return result.ok() && dup.code() == StatusCode::already_exists ? 0 : 1;
}
