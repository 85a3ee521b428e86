// ordered_delivery.hpp (internal) — results delivered in submit order, per sequence key: the one
// implementation the engine (EngineOptions::ordered_delivery, per RequestOptions::sequence_key)
// and the pipeline (PipelineOptions::ordered, one sequence) share.
//
// Each unit of work accepted takes the next number of its key (assign(); the caller assigns in
// acceptance order, under its own acceptance lock, so numbers follow acceptance). Every number
// assigned must be added exactly once — whatever the outcome — or its key's later results wait
// for good. A finished unit's value waits until every earlier number of its key has been
// delivered. One drain per key runs at a time (the `draining` flag): add() says whether the caller
// must start it, and the drain calls take_ready() until it returns nothing, delivering each run
// of values with no lock held. So order holds with any number of completing threads, and the
// caller's code (user callbacks) never runs under this class's mutex. A key with nothing
// outstanding is forgotten, and its numbering then starts again at 0: the numbers order
// deliveries, they do not identify work (the pipeline once used them as item keys: a lost item,
// tests/stress AdvPipeline.ItemDeliveredButNotRetiredDoesNotShareItsIdentity).
//
// Thread safety: every method is thread-safe (one mutex, a leaf: nothing else is locked under
// it). Blocking: none beyond that mutex. `T` is moved in and out; `Key` needs std::hash and
// operator< (the backlog's map); std::monostate serves as the key of a single sequence.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace asyncinfer::detail {

template <class T, class Key = std::monostate>
class OrderedDelivery {
 public:
  /// The next number in `key`'s sequence (0, 1, 2, … per key).
  std::uint64_t assign(const Key& key = Key{}) {
    std::lock_guard lock(mu_);
    return keys_[key].next_assign++;
  }

  /// Files `value` as number `number` of `key`; true when the caller must drain the key (no
  /// drain of it is running).
  bool add(const Key& key, std::uint64_t number, T&& value) {
    std::lock_guard lock(mu_);
    Sequence& q = keys_[key];
    q.ready.emplace(number, std::move(value));
    if (q.draining) return false;
    q.draining = true;
    return true;
  }

  /// The values of `key` that are next in order (removed); empty = the drain is over (the caller
  /// stops; a later add() starts the next one).
  std::vector<T> take_ready(const Key& key) {
    std::vector<T> run;
    std::lock_guard lock(mu_);
    auto it = keys_.find(key);
    if (it == keys_.end()) return run;
    Sequence& q = it->second;
    while (!q.ready.empty() && q.ready.begin()->first == q.next_deliver) {
      run.push_back(std::move(q.ready.begin()->second));
      q.ready.erase(q.ready.begin());
      ++q.next_deliver;
    }
    if (run.empty()) {
      q.draining = false;
      if (q.ready.empty() && q.next_assign == q.next_deliver) keys_.erase(it);
    }
    return run;
  }

  /// Adds to `total` the units assigned and not yet delivered, and fills `top` with the
  /// `max_keys` keys that have most (those with none are left out).
  void backlog(std::int64_t& total, std::map<Key, std::int64_t>& top, std::size_t max_keys) const {
    std::vector<std::pair<std::int64_t, const Key*>> keys;
    std::lock_guard lock(mu_);
    for (const auto& [key, q] : keys_) {
      const auto n = static_cast<std::int64_t>(q.next_assign - q.next_deliver);
      total += n;
      if (n > 0) keys.emplace_back(n, &key);
    }
    if (keys.size() > max_keys) {
      std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(max_keys),
                       keys.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      keys.resize(max_keys);
    }
    for (const auto& [n, key] : keys) top.emplace(*key, n);
  }

 private:
  struct Sequence {
    std::uint64_t next_assign = 0;
    std::uint64_t next_deliver = 0;
    std::map<std::uint64_t, T> ready;
    bool draining = false;
  };
  mutable std::mutex mu_;
  std::unordered_map<Key, Sequence> keys_;
};

}  // namespace asyncinfer::detail
