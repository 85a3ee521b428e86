// The response cache's request path (inference_server.hpp): InferenceServer::submit_cached, which
// looks a request up in the ResponseCache (response_cache.hpp) and answers a hit, leads a flight
// or follows one, the CacheFollower that waits for a leader, and fill_cache, which a leader's
// completion runs. A follower whose leader failed looks the key up again and may lead a new flight
// through InferenceServer::run; every answer is made by make_response (inference_response.hpp).
#include "inference_server.hpp"

#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "inference_response.hpp"

namespace asyncinfer::server {

/// A request waiting for an identical one in flight (ResponseCache's follower): answered with
/// the leader's outputs, or, when the leader failed, looked up again (rejoin): a hit, a follower
/// of the new flight, or that flight's leader, which runs on the engine and fills the cache.
class InferenceServer::CacheFollower final
    : public InflightRequest::Handle,
      public std::enable_shared_from_this<InferenceServer::CacheFollower> {
 public:
  CacheFollower(InferenceServer& server, ModelRef model, Inputs inputs, RequestOptions options,
                std::string id, std::vector<std::size_t> selected, Completion done,
                std::shared_ptr<const CacheKey> key, Clock::time_point start)
      : server_(server),
        model_(std::move(model)),
        inputs_(std::move(inputs)),
        options_(std::move(options)),
        id_(std::move(id)),
        selected_(std::move(selected)),
        done_(std::move(done)),
        key_(std::move(key)),
        start_(start) {}

  /// Not a follower after all (a hit, or the leader): hands the request back.
  std::pair<Inputs, Completion> take_back() {
    std::lock_guard lock(mu_);
    ended_ = true;
    return {std::move(inputs_), std::move(done_)};
  }

  /// Once it follows: its ticket, and what its lookup took (its cache_hit time if it hits).
  void followed(std::uint64_t ticket, std::uint64_t lookup_ns) {
    std::lock_guard lock(mu_);
    ticket_ = ticket;
    lookup_ns_ = lookup_ns;
  }

  /// The leader's result (called once, unless withdrawn first).
  void on_leader(const Result<Outputs>& r) {
    Completion done;
    bool cancelled = false;
    std::uint64_t lookup_ns = 0;
    {
      std::lock_guard lock(mu_);
      if (ended_) return;
      cancelled = cancelled_;
      lookup_ns = lookup_ns_;
      if (r.ok() || cancelled) {
        ended_ = true;
        done = std::move(done_);
      }
    }
    CacheCounters& counters = model_->cache_counters;
    if (done) {
      if (cancelled) return done(cancelled_error("the request was cancelled"));
      // A hit; its time is its lookup's (the wait for the leader is the leader's compute).
      counters.hit(lookup_ns);
      return done(make_response(model_, std::move(id_), selected_, *r));
    }
    // The leader failed: its failure (its deadline, its cancellation) is not this request's. It
    // looks the key up again, within what is left of the model's default timeout from its own
    // arrival (not a fresh one): the first of the failed leader's followers to do so leads a new
    // flight and the others follow it, so that one computation answers them all rather than
    // each computing alone, one after another (issue 45). A result cached meanwhile is a hit.
    rejoin();
  }

  void cancel() override {
    Completion done;
    bool own = false;
    {
      std::lock_guard lock(mu_);
      cancelled_ = true;
      if (own_.valid()) {
        own = true;
      } else if (!ended_ && server_.cache_->withdraw(*key_, ticket_)) {
        ended_ = true;
        done = std::move(done_);
      }
    }
    // Outside the lock: a cancel may run completions inline (an engine without a callback
    // executor). own_ is set once, before `own` can be true, and never changed after.
    if (own) own_.cancel();
    if (done) done(cancelled_error("the request was cancelled"));
  }

 private:
  /// A second lookup after the leader failed: a hit answers, a follower waits for the new
  /// leader (on_leader again), a leader (or a request alone) runs on the engine and fills the
  /// cache for those who follow it.
  void rejoin() {
    const Clock::time_point t = Clock::now();
    ResponseCache* cache = server_.cache_.get();
    ResponseCache::Waiter waiter = [self = shared_from_this()](const Result<Outputs>& r) {
      self->on_leader(r);
    };
    ResponseCache::Lookup found = cache->lookup(*key_, true, waiter);
    std::uint64_t lookup_ns = 0;
    {
      std::lock_guard lock(mu_);
      lookup_ns_ += ns_since(t);
      lookup_ns = lookup_ns_;
      if (found.role == ResponseCache::Role::follower) {
        ticket_ = found.ticket;  // cancel() withdraws this one now
        return;
      }
    }
    CacheCounters& counters = model_->cache_counters;
    auto shared = std::make_shared<Completion>();
    {
      std::lock_guard lock(mu_);
      *shared = std::move(done_);
    }
    if (found.role == ResponseCache::Role::hit) {
      {
        std::lock_guard lock(mu_);
        ended_ = true;
      }
      counters.hit(lookup_ns);
      return (*shared)(make_response(model_, std::move(id_), selected_, found.outputs));
    }
    RequestOptions options = options_;
    if (const auto& d = model_->engine->options().default_timeout; d && !options.deadline) {
      options.deadline = start_ + *d;
    }
    const bool led = found.role == ResponseCache::Role::leader;
    auto accepted = server_.run(
        model_, std::move(inputs_), options, std::move(id_), std::move(selected_),
        [shared](Result<InferResponse> out) { (*shared)(std::move(out)); },
        server_.fill_cache(*model_, key_, led, lookup_ns));
    if (!accepted.ok()) {
      {
        std::lock_guard lock(mu_);
        ended_ = true;
      }
      return (*shared)(accepted.status());  // run() destroyed its completion uncalled
    }
    bool cancel_now = false;
    {
      std::lock_guard lock(mu_);
      ended_ = true;
      own_ = std::move(*accepted);  // set once, never changed after
      cancel_now = cancelled_;
    }
    if (cancel_now) own_.cancel();
  }

  InferenceServer& server_;
  const ModelRef model_;
  Inputs inputs_;
  RequestOptions options_;
  std::string id_;
  std::vector<std::size_t> selected_;
  Completion done_;
  const std::shared_ptr<const CacheKey> key_;
  const Clock::time_point start_;
  std::mutex mu_;
  std::uint64_t ticket_ = 0;
  std::uint64_t lookup_ns_ = 0;
  bool ended_ = false;  ///< answered, handed back, or running on its own (own_)
  bool cancelled_ = false;
  InflightRequest own_;  ///< its own run after the leader failed
};

Result<InflightRequest> InferenceServer::submit_cached(const ModelRef& ref, Inputs inputs,
                                                       const RequestOptions& options,
                                                       std::string id,
                                                       std::vector<std::size_t> selected,
                                                       Completion done) {
  const ModelVersion& model = *ref;
  const Clock::time_point start = Clock::now();
  for (const Tensor& t : inputs) {
    if (!t.is_host_accessible()) {  // not hashable here: computed as without a cache
      return run(ref, std::move(inputs), options, std::move(id), std::move(selected),
                 std::move(done));
    }
  }
  auto key = std::make_shared<const CacheKey>(
      response_cache_key(model.model_name, model.version, inputs, model.generation));
  // Only a request that asks nothing of its own waits for another: one with its own deadline
  // (`timeout`, a gRPC deadline) must not wait on another's pace, nor one with a priority of its
  // own behind a leader of another level. Either computes alone (and still hits).
  const bool join = !options.timeout && !options.deadline && options.priority == 0;
  // A follower must be complete before the cache can call it: made first, taken back if the
  // request turns out to be a hit or a leader.
  std::shared_ptr<CacheFollower> follower;
  ResponseCache::Waiter waiter;
  if (join) {
    follower = std::make_shared<CacheFollower>(*this, ref, std::move(inputs), options, id, selected,
                                               std::move(done), key, start);
    waiter = [follower](const Result<Outputs>& r) { follower->on_leader(r); };
  }
  ResponseCache::Lookup found = cache_->lookup(*key, join, waiter);
  const std::uint64_t lookup_ns = ns_since(start);
  if (follower && found.role != ResponseCache::Role::follower) {
    std::tie(inputs, done) = follower->take_back();
  }
  CacheCounters& counters = model.cache_counters;
  switch (found.role) {
    case ResponseCache::Role::hit: {
      InferResponse response = make_response(ref, std::move(id), selected, found.outputs);
      counters.hit(ns_since(start));
      done(std::move(response));
      return InflightRequest();
    }
    case ResponseCache::Role::follower:
      follower->followed(found.ticket, lookup_ns);
      return InflightRequest(std::move(follower));
    case ResponseCache::Role::leader:
    case ResponseCache::Role::alone:
      break;
  }
  const bool led = found.role == ResponseCache::Role::leader;
  return run(ref, std::move(inputs), options, std::move(id), std::move(selected), std::move(done),
             fill_cache(model, std::move(key), led, lookup_ns));
}

InferenceServer::Finished InferenceServer::fill_cache(const ModelVersion& model,
                                                      std::shared_ptr<const CacheKey> key, bool led,
                                                      std::uint64_t lookup_ns) {
  return [this, &counters = model.cache_counters, key = std::move(key), led,
          lookup_ns](const Result<Outputs>& r) {
    // Timed: the copy into the cache (Triton's cache_miss is lookup + insertion).
    const Clock::time_point t = Clock::now();
    std::vector<ResponseCache::Waiter> followers = cache_->finish(*key, led, r);
    counters.miss(lookup_ns + ns_since(t));
    for (ResponseCache::Waiter& w : followers) w(r);
  };
}

}  // namespace asyncinfer::server
