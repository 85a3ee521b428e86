// result_store.hpp (internal) — the id-based API's bounded store (the article's §3.1 result_store,
// which grows forever).
//
// Holds one entry per id: live (pending or running) or finished. Bounded: at most `capacity`
// entries; when full, the oldest finished entry is evicted, and when every entry is live the
// submit is refused (resource_exhausted). Finished entries expire `ttl` after they finished
// (purged lazily on every insert and on lookup, so memory stays flat whether or not anyone
// fetches). A bounded list of tombstones remembers why recent ids went away, so a late reader is
// told "expired" or "evicted" rather than "unknown". Thread-safe (one mutex; no user code under
// it).
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "engine/request.hpp"

namespace asyncinfer::detail {

class ResultStore {
 public:
  ResultStore(std::size_t capacity, std::chrono::milliseconds ttl)
      : capacity_(capacity), ttl_(ttl), ttl_ticks_(saturating_cast<Clock::duration>(ttl)) {}

  /// Registers a live request under its id. already_exists while that id is live; a finished
  /// entry with the same id is replaced. resource_exhausted when every entry is live.
  Status insert(const std::shared_ptr<Request>& r);
  /// Removes an entry registered by insert() whose request was then refused.
  void erase_refused(const std::string& id, const Request* r);
  /// Marks `r`'s entry finished now (starts its TTL, makes it evictable).
  void mark_finished(const Request& r);
  /// The request under `id`; not_found naming whether it is unknown, expired or evicted.
  Result<std::shared_ptr<Request>> find(std::string_view id);
  /// Forgets a finished entry; failed_precondition while live; not_found as find().
  Status release(std::string_view id);
  std::size_t size() const;

 private:
  struct Entry {
    std::shared_ptr<Request> request;
    bool finished = false;
    Clock::time_point finished_at{};
    std::list<std::string>::iterator finished_pos;
  };
  void purge_expired(Clock::time_point now);
  void bury(const std::string& id, std::string reason);
  Status not_found(std::string_view id) const;

  const std::size_t capacity_;
  const std::chrono::milliseconds ttl_;
  const Clock::duration ttl_ticks_;  // ttl_ in the clock's unit, saturating (max() never expires)
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> finished_;  // oldest finished first
  std::unordered_map<std::string, std::string> tombstones_;
  std::deque<std::string> tombstone_order_;
};

}  // namespace asyncinfer::detail
