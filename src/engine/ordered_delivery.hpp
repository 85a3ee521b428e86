// ordered_delivery.hpp (internal) — results delivered in submit order per sequence key
// (EngineOptions::ordered_delivery).
//
// Each accepted request takes the next number of its key (assign(), under the engine's queue
// mutex, so numbers follow acceptance order). A finished request's result waits in `ready` until
// every earlier number of its key has been delivered. One drain per key runs at a time (the
// `draining` flag): add() says whether the caller must start it, and the drain calls take_ready()
// until it returns nothing, delivering each run of results with no lock held. So order holds with
// any number of completion threads, and user code never runs under this class's mutex. A key
// with nothing outstanding is forgotten. Thread-safe (one mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/request.hpp"

namespace asyncinfer::detail {

/// A finished request and its result, waiting for delivery.
struct Pending {
  std::shared_ptr<Request> request;
  Result<Outputs> result;
};

class OrderedDelivery {
 public:
  /// The next number in `key`'s sequence.
  std::uint64_t assign(const std::string& key);
  /// Files `r`'s result under its key and number; true when the caller must drain the key (no
  /// drain of it is running).
  bool add(const std::shared_ptr<Request>& r, Result<Outputs>&& result);
  /// The results of `key` that are next in order (removed); empty = the drain is over (the
  /// caller stops; a later add() starts the next one).
  std::vector<Pending> take_ready(const std::string& key);

  /// Requests accepted and not yet delivered, in all and for the `max_keys` keys with most.
  void backlog(std::int64_t& total, std::map<std::string, std::int64_t>& top,
               std::size_t max_keys) const;

 private:
  struct Key {
    std::uint64_t next_assign = 0;
    std::uint64_t next_deliver = 0;
    std::map<std::uint64_t, Pending> ready;
    bool draining = false;
  };
  mutable std::mutex mu_;
  std::unordered_map<std::string, Key> keys_;
};

}  // namespace asyncinfer::detail
