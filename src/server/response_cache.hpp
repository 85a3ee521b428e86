// response_cache.hpp — Triton's response cache (`--cache-config local,size=BYTES`, a model's
// `response_cache { enable: true }`): successful responses kept in an LRU bounded by bytes, so that
// a request whose inputs were seen before is answered without running the model.
//
// After Triton's local cache (docs/user_guide/response_cache.md; core's RequestResponseCache):
//   - the key is a hash of the model's name and version, and of each input's name, datatype,
//     shape and bytes (here, in the model's input order, which makes the order a client sends
//     them in irrelevant). An entry holds every output of the model, as the engine computes
//     them all: requests that select different outputs share it;
//   - only successful responses are kept; the least recently used entries make room for new ones;
//     an entry larger than the whole cache is not kept;
//   - statistics: a hit counts in `cache_hit` (the time to find and copy out the entry), a miss
//     in `cache_miss` (the time to look up and, later, to insert).
// Beyond Triton, identical requests in flight at once compute once (CoalescedFlight): the first
// one (the leader) runs the model, the others (followers) wait for its result. A follower never
// inherits the leader's failure: when the leader fails, each follower runs the model itself.
//
// Unlike Triton's, whose key is the 64-bit hash alone, a hit compares the whole key exactly (the
// model, version, dtypes, shapes and every input byte): std::hash is not keyed, so a client could
// craft an input with the hash of a popular one and have its answer served to everyone else. The
// price is a copy of the inputs in each entry, counted in its bytes.
//
// Thread safety: every member may be called from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "asyncinfer/detail/unique_function.hpp"
#include "asyncinfer/status.hpp"
#include "asyncinfer/tensor.hpp"

namespace asyncinfer::server {

/// What a request is cached under: the hash, and the bytes compared exactly on a hit.
struct CacheKey {
  std::uint64_t hash = 0;
  std::string bytes;  ///< model, version, each input's dtype, shape and data
  bool operator==(const CacheKey& o) const noexcept { return hash == o.hash && bytes == o.bytes; }
};

/// The cache key of a request for `model` version `version` with `inputs` (in the model's input
/// order, all host-accessible). `generation` tells loads of one version apart
/// (ModelVersion::generation): a reloaded version, whose files or config may have changed, never
/// hits what the one it replaced computed.
CacheKey response_cache_key(std::string_view model, std::int64_t version,
                            std::span<const Tensor> inputs, std::uint64_t generation = 0);

/// A version's hit and miss counters (Triton's cache_hit / cache_miss statistics). Copying reads
/// each counter (relaxed): for a ModelVersion that is made, then moved into place.
struct CacheCounters {
  CacheCounters() = default;
  CacheCounters(const CacheCounters& o) noexcept
      : hits(o.hits.load(std::memory_order_relaxed)),
        hit_ns(o.hit_ns.load(std::memory_order_relaxed)),
        misses(o.misses.load(std::memory_order_relaxed)),
        miss_ns(o.miss_ns.load(std::memory_order_relaxed)) {}
  CacheCounters& operator=(const CacheCounters&) = delete;

  void hit(std::uint64_t ns) noexcept {
    hits.fetch_add(1, std::memory_order_relaxed);
    hit_ns.fetch_add(ns, std::memory_order_relaxed);
  }
  void miss(std::uint64_t ns) noexcept {
    misses.fetch_add(1, std::memory_order_relaxed);
    miss_ns.fetch_add(ns, std::memory_order_relaxed);
  }

  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> hit_ns{0};
  std::atomic<std::uint64_t> misses{0};
  std::atomic<std::uint64_t> miss_ns{0};
};

class ResponseCache {
 public:
  /// Called once with the leader's result (its outputs, or its error).
  using Waiter = detail::UniqueFunction<void(const Result<std::vector<Tensor>>&)>;

  /// `capacity_bytes`: what the entries' tensors and bookkeeping may take, > 0.
  explicit ResponseCache(std::size_t capacity_bytes);
  ResponseCache(const ResponseCache&) = delete;
  ResponseCache& operator=(const ResponseCache&) = delete;

  enum class Role : std::uint8_t {
    hit,       ///< `outputs` holds the cached answer (shared, read-only)
    leader,    ///< compute, then call finish() with the result
    follower,  ///< `waiter` is kept and called with the leader's result; `ticket` can withdraw it
    alone,     ///< compute, then finish() with `join` false: no flight to join or to lead
  };
  struct Lookup {
    Role role = Role::alone;
    std::vector<Tensor> outputs;  ///< on a hit
    std::uint64_t ticket = 0;     ///< a follower's, for withdraw()
  };

  /// Looks `key` up. A hit moves the entry to the front. On a miss with `join` true, the request
  /// leads a new flight or follows the one in progress (then `waiter` is taken); with `join`
  /// false (a request with a deadline of its own, which a leader's pace must not decide) it
  /// computes alone.
  Lookup lookup(const CacheKey& key, bool join, Waiter& waiter);
  /// The leader's (or a lone request's) result: a success is copied into the cache (when it fits).
  /// `led`: the request was its flight's leader; its followers are returned, for the caller to
  /// call with the result (after it has answered the leader; none of them is called here).
  std::vector<Waiter> finish(const CacheKey& key, bool led,
                             const Result<std::vector<Tensor>>& result);
  /// Removes a follower that has not been called yet (a cancelled request); true when it was
  /// still waiting (its waiter is destroyed uncalled).
  bool withdraw(const CacheKey& key, std::uint64_t ticket);

  std::size_t capacity() const noexcept { return capacity_; }
  std::size_t bytes() const;
  std::size_t entries() const;
  std::uint64_t evictions() const noexcept { return evictions_.load(std::memory_order_relaxed); }

 private:
  struct KeyHash {
    std::size_t operator()(const CacheKey& k) const noexcept { return k.hash; }
  };
  struct Entry {
    CacheKey key;
    std::vector<Tensor> outputs;
    std::size_t bytes = 0;
  };
  struct Flight {
    std::vector<std::pair<std::uint64_t, Waiter>> followers;
  };

  void insert_locked(const CacheKey& key, std::vector<Tensor> outputs);

  const std::size_t capacity_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  ///< most recently used first
  std::unordered_map<CacheKey, std::list<Entry>::iterator, KeyHash> index_;
  std::unordered_map<CacheKey, Flight, KeyHash> flights_;
  std::size_t bytes_ = 0;
  std::uint64_t next_ticket_ = 1;
  std::atomic<std::uint64_t> evictions_{0};
};

/// Parses Triton's `--cache-config` values ("local,size=1048576"; repeatable, later ones win):
/// the local cache's size in bytes. invalid_argument naming the value for another cache
/// ("redis" is not built in), a key other than size, or a size that is not a positive integer.
Result<std::size_t> parse_cache_config(std::span<const std::string> values);

}  // namespace asyncinfer::server
