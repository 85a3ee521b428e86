// engine_timeline.hpp (internal) — which engine of a class a simulated item occupies, and when.
//
// Each engine is free from one time point on (the end of its last reservation). An item that may
// start at `earliest` takes, among the engines already free by then, the one freed most recently
// ("best fit"); only when none is free by then does it take the one that frees first, and wait.
//
// Why best fit and not "earliest free": reservations arrive in host order, which a late stream
// thread (a loaded machine, a sanitizer) can put behind its simulated order. Under earliest-free,
// a stream that runs ahead parks its next item on an idle engine that a late stream needs for an
// item that is, in simulated time, earlier; the late item then waits for nothing (seen in CI: two
// streams on two engines ending at 12 ms instead of 10). Under best fit, a stream keeps the
// engine its previous item freed (free exactly at its own clock), and the idle engines stay idle
// for whoever needs them earlier, so while there are no more busy streams than engines the
// timeline does not depend on host order at all. With more streams than engines the engines are
// shared first come, first served, in host order, as a hardware queue would serve them in arrival
// order. Not thread-safe: the device calls it under its own mutex.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "asyncinfer/executor.hpp"

namespace asyncinfer::detail {

/// A reservation of engine `index` over [start, end).
struct EngineSlot {
  std::size_t index;
  Clock::time_point start;
  Clock::time_point end;
};

/// The engines of one class (compute, or copies in one direction).
class EngineTimeline {
 public:
  /// `engines` >= 1 engines, all free from the clock's epoch.
  explicit EngineTimeline(std::size_t engines) : free_at_(engines) {}

  /// Reserves an engine for `duration` from `earliest` or, when all are busy then, from the
  /// first moment one is free (best fit, above).
  EngineSlot reserve(Clock::time_point earliest, Clock::duration duration) {
    std::size_t fit = free_at_.size();  // engine free by `earliest`, freed most recently
    std::size_t first = 0;              // engine that frees first
    for (std::size_t i = 0; i < free_at_.size(); ++i) {
      if (free_at_[i] <= earliest && (fit == free_at_.size() || free_at_[i] > free_at_[fit])) {
        fit = i;
      }
      if (free_at_[i] < free_at_[first]) first = i;
    }
    const std::size_t index = fit < free_at_.size() ? fit : first;
    const Clock::time_point start = std::max(earliest, free_at_[index]);
    const Clock::time_point end = saturating_add(start, duration);  // max(): until released
    free_at_[index] = end;
    return {index, start, end};
  }

  /// Gives back the unused end of `slot`, cut short at `at`, unless the engine was reserved
  /// again after it.
  void release_early(const EngineSlot& slot, Clock::time_point at) {
    Clock::time_point& free = free_at_[slot.index];
    if (free == slot.end) free = std::max(slot.start, std::min(at, slot.end));
  }

  /// When engine `index` is free.
  Clock::time_point free_at(std::size_t index) const { return free_at_[index]; }

 private:
  std::vector<Clock::time_point> free_at_;
};

}  // namespace asyncinfer::detail
