// detail/chrono.hpp — saturating time arithmetic: the one place where a duration or a time point
// taken by the public API meets now(), a unit conversion or a comparison.
//
// Design: C++ users say "no limit" with std::chrono::*::max(). Plain chrono arithmetic on it
// overflows (now() + max() is signed overflow: undefined behaviour, in practice a deadline in the
// past), and so does converting a coarse max() to a finer unit (milliseconds::max() in
// nanoseconds). Every function and option of include/asyncinfer/ that takes a duration or a
// time point goes through these helpers instead:
//   - saturating_cast<To>(d): d in unit To, clamped to To's range (max() stays max());
//   - saturating_add(t, d): t + d clamped to the time point's range; a sum past the end is
//     time_point::max(), which every wait and timer in the library treats as "never";
//     saturating_sum(a, b) and saturating_sub(a, b) do the same for two durations;
//   - deadline_after(d): saturating_add(steady_clock::now(), d);
//   - to_steady(t): a time point of any clock as a steady-clock time point (max() stays max());
//   - no_limit(t): whether a deadline means "wait forever".
// Values below zero clamp the same way at the other end (a negative timeout is a deadline that
// has already passed). Integer reps are computed in 128 bits, so no intermediate can overflow;
// floating reps (duration<double>) are clamped before the conversion to an integer rep.
//
// Thread safety: pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <ratio>
#include <type_traits>

namespace asyncinfer::detail {

__extension__ using Int128 = __int128;  // GCC and Clang on every 64-bit target we build for

/// `d` in the unit `To`, truncated toward zero like duration_cast, clamped to To's range.
template <class To, class Rep, class Period>
constexpr To saturating_cast(std::chrono::duration<Rep, Period> d) noexcept {
  using ToRep = typename To::rep;
  using R = std::ratio_divide<Period, typename To::period>;
  constexpr ToRep hi = std::numeric_limits<ToRep>::max();
  constexpr ToRep lo = std::numeric_limits<ToRep>::lowest();
  if constexpr (std::is_floating_point_v<Rep> || std::is_floating_point_v<ToRep>) {
    const long double v = static_cast<long double>(d.count()) * static_cast<long double>(R::num) /
                          static_cast<long double>(R::den);
    if (!(v == v)) return To::zero();  // NaN
    if (v >= static_cast<long double>(hi)) return To(hi);
    if (v <= static_cast<long double>(lo)) return To(lo);
    return To(static_cast<ToRep>(v));
  } else {
    static_assert(sizeof(Rep) <= 8 && sizeof(ToRep) <= 8, "64-bit reps at most");
    const Int128 v =
        static_cast<Int128>(d.count()) * static_cast<Int128>(R::num) / static_cast<Int128>(R::den);
    if (v >= static_cast<Int128>(hi)) return To(hi);
    if (v <= static_cast<Int128>(lo)) return To(lo);
    return To(static_cast<ToRep>(v));
  }
}

/// `t + d`, clamped to the range of t's type: time_point::max() ("never") when the sum is past
/// the end, time_point::min() when before the start.
template <class C, class D, class Rep, class Period>
constexpr std::chrono::time_point<C, D> saturating_add(
    std::chrono::time_point<C, D> t, std::chrono::duration<Rep, Period> d) noexcept {
  using TP = std::chrono::time_point<C, D>;
  const D step = saturating_cast<D>(d);
  const D since = t.time_since_epoch();
  if (step > D::zero() && since > D::max() - step) return TP::max();
  if (step < D::zero() && since < D::min() - step) return TP::min();
  return t + step;
}

/// `a + b` for two durations of one type, clamped to its range.
template <class D>
constexpr D saturating_sum(D a, D b) noexcept {
  if (b > D::zero() && a > D::max() - b) return D::max();
  if (b < D::zero() && a < D::min() - b) return D::min();
  return a + b;
}

/// `a - b` for two durations of one type, clamped to its range.
template <class D>
constexpr D saturating_sub(D a, D b) noexcept {
  if (b < D::zero() && a > D::max() + b) return D::max();
  if (b > D::zero() && a < D::min() + b) return D::min();
  return a - b;
}

/// now() + d on the steady clock, saturating: time_point::max() for "no limit".
template <class Rep, class Period>
std::chrono::steady_clock::time_point deadline_after(
    std::chrono::duration<Rep, Period> d) noexcept {
  return saturating_add(std::chrono::steady_clock::now(), d);
}

/// `t`, of any clock, as a steady-clock time point: the same distance from now, saturating.
/// time_point::max() of any clock is steady_clock's max() ("no limit").
template <class C, class D>
std::chrono::steady_clock::time_point to_steady(std::chrono::time_point<C, D> t) noexcept {
  using Steady = std::chrono::steady_clock;
  using TP = std::chrono::time_point<C, D>;
  if (t == TP::max()) return Steady::time_point::max();
  if constexpr (std::is_same_v<C, Steady>) {
    return Steady::time_point(saturating_cast<Steady::duration>(t.time_since_epoch()));
  } else {
    const auto at = saturating_cast<Steady::duration>(t.time_since_epoch());
    const auto now = saturating_cast<Steady::duration>(C::now().time_since_epoch());
    return saturating_add(Steady::now(), saturating_sub(at, now));
  }
}

/// Whether a steady-clock deadline means "wait forever".
inline bool no_limit(std::chrono::steady_clock::time_point t) noexcept {
  return t == std::chrono::steady_clock::time_point::max();
}

}  // namespace asyncinfer::detail
