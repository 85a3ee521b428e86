// The checked state machines (asyncinfer/detail/transitions.hpp): the helper itself, and the
// tables of the engine's life cycle, an HTTP session's phase, generate_stream state and close
// reason, a gRPC ModelStreamInfer call's read side and end, and the gRPC frontend's life. Legal
// moves are accepted; an illegal one aborts with a message naming both states. Also an enum's
// names in one table (asyncinfer/detail/enum_names.hpp).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <utility>

#include "asyncinfer/detail/enum_names.hpp"
#include "asyncinfer/detail/transitions.hpp"
#include "engine/scheduler.hpp"
#include "server/grpc/grpc_server_state.hpp"
#include "server/grpc/grpc_stream_state.hpp"
#include "server/http/http_session_state.hpp"

namespace asyncinfer {
namespace {

using detail::Transitions;

/// Every (from, to) of an N-state table that it allows.
template <class E, std::size_t N>
std::set<std::pair<int, int>> allowed(const Transitions<E, N>& t) {
  std::set<std::pair<int, int>> out;
  for (std::size_t a = 0; a < N; ++a) {
    for (std::size_t b = 0; b < N; ++b) {
      if (t.allows(static_cast<E>(a), static_cast<E>(b))) {
        out.emplace(static_cast<int>(a), static_cast<int>(b));
      }
    }
  }
  return out;
}

enum class Door : std::uint8_t { open, closed, locked };
constexpr Transitions<Door, 3> kDoorMoves{
    "door",
    {"open", "closed", "locked"},
    {{Door::open, Door::closed}, {Door::closed, Door::open}, {Door::closed, Door::locked}}};
static_assert(kDoorMoves.allows(Door::closed, Door::locked));
static_assert(!kDoorMoves.allows(Door::open, Door::locked));
static_assert(!kDoorMoves.allows(Door::open, static_cast<Door>(7)));  // out of range: never

TEST(Transitions, MoveMakesALegalChange) {
  Door d = Door::open;
  kDoorMoves.move(d, Door::closed);
  kDoorMoves.move(d, Door::locked);
  EXPECT_EQ(d, Door::locked);
  EXPECT_STREQ(kDoorMoves.name(Door::closed), "closed");
  EXPECT_STREQ(kDoorMoves.name(static_cast<Door>(9)), "?");
  EXPECT_STREQ(kDoorMoves.what(), "door");
  EXPECT_EQ(allowed(kDoorMoves), (std::set<std::pair<int, int>>{{0, 1}, {1, 0}, {1, 2}}));
}

TEST(TransitionsDeathTest, AnIllegalChangeAbortsNamingBothStates) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Door d = Door::open;
        kDoorMoves.move(d, Door::locked);
      },
      "internal error: door open -> locked: not in the table");
  EXPECT_DEATH(kDoorMoves.fail(Door::closed, Door::open, "the key is lost"),
               "door closed -> open: the key is lost");
}

// ---- the engine -------------------------------------------------------------------------------

TEST(EngineStateMoves, TheTableIsTheOldRule) {
  using detail::EngineState;
  using detail::kEngineStateMoves;
  // Before the table, set_state() allowed: later states only, and stopped only from cancelling.
  for (int a = 0; a < 4; ++a) {
    for (int b = 0; b < 4; ++b) {
      const auto from = static_cast<EngineState>(a);
      const auto to = static_cast<EngineState>(b);
      const bool rule =
          to > from && (to != EngineState::stopped || from == EngineState::cancelling);
      EXPECT_EQ(kEngineStateMoves.allows(from, to), rule) << a << " -> " << b;
    }
  }
  EXPECT_STREQ(detail::to_string(EngineState::cancelling), "cancelling");
}

TEST(EngineStateMovesDeathTest, AnIllegalChangeAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      detail::kEngineStateMoves.check(detail::EngineState::draining, detail::EngineState::stopped),
      "engine state draining -> stopped: not in the table");
}

// ---- the HTTP session -------------------------------------------------------------------------

TEST(SessionPhaseMoves, TheLifeOfAConnection) {
  using P = server::SessionPhase;
  const auto& t = server::kSessionPhaseMoves;
  P p = P::idle;
  // start(), a request with a body run by the engine, its response, keep-alive.
  for (P to : {P::idle, P::header, P::body, P::handling, P::handling, P::writing, P::idle}) {
    t.move(p, to);
  }
  // A request answered on the strand, then the connection closes gracefully.
  for (P to : {P::header, P::writing, P::lingering, P::closed}) t.move(p, to);
  EXPECT_EQ(p, P::closed);
  EXPECT_TRUE(t.allows(P::idle, P::writing));     // a refused connection's 429
  EXPECT_TRUE(t.allows(P::idle, P::lingering));   // --idle-timeout
  EXPECT_TRUE(t.allows(P::header, P::handling));  // a request without a body
  for (int a = 0; a < 6; ++a) EXPECT_TRUE(t.allows(static_cast<P>(a), P::closed)) << a;
  for (int b = 0; b < 7; ++b) EXPECT_FALSE(t.allows(P::closed, static_cast<P>(b))) << b;
  EXPECT_FALSE(t.allows(P::lingering, P::idle));
  EXPECT_FALSE(t.allows(P::idle, P::handling));
  EXPECT_FALSE(t.allows(P::writing, P::handling));
  EXPECT_FALSE(t.allows(P::body, P::header));
  EXPECT_EQ(allowed(t).size(), 19u);
}

TEST(SseMoves, AStreamAndTheNext) {
  using S = server::SseState;
  const auto& t = server::kSseMoves;
  S s = S::none;
  for (S to : {S::header, S::events, S::final, S::last, S::none}) t.move(s, to);
  for (S to : {S::header, S::final, S::last, S::none}) t.move(s, to);  // final during the header
  EXPECT_EQ(s, S::none);
  EXPECT_FALSE(t.allows(S::none, S::final));  // the header is always written first
  EXPECT_FALSE(t.allows(S::events, S::last));
  EXPECT_FALSE(t.allows(S::final, S::events));
  EXPECT_EQ(allowed(t).size(), 6u);
}

TEST(CloseReasonMoves, AStrongerReasonReplacesAWeakerOne) {
  using C = server::CloseReason;
  const auto& t = server::kCloseReasonMoves;
  C c = C::none;
  // A drain, a deadline that passes during it, the client gone while the 408 is written.
  for (C to : {C::draining, C::timed_out, C::client_gone}) t.move(c, to);
  EXPECT_EQ(c, C::client_gone);
  EXPECT_TRUE(t.allows(C::timed_out, C::none));  // a new deadline
  EXPECT_FALSE(t.allows(C::draining, C::none));  // a drain is not undone
  EXPECT_FALSE(t.allows(C::timed_out, C::draining));
  for (int b = 0; b < 4; ++b) EXPECT_FALSE(t.allows(C::client_gone, static_cast<C>(b))) << b;
  EXPECT_EQ(allowed(t).size(), 7u);
}

TEST(SessionMovesDeathTest, IllegalChangesAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto p = server::SessionPhase::closed;
        server::kSessionPhaseMoves.move(p, server::SessionPhase::writing);
      },
      "HTTP session phase closed -> writing: not in the table");
  EXPECT_DEATH(
      {
        auto s = server::SseState::none;
        server::kSseMoves.move(s, server::SseState::last);
      },
      "generate_stream state none -> last: not in the table");
  EXPECT_DEATH(
      {
        auto c = server::CloseReason::client_gone;
        server::kCloseReasonMoves.move(c, server::CloseReason::none);
      },
      "HTTP session close reason client_gone -> none: not in the table");
}

// ---- the gRPC stream call ---------------------------------------------------------------------

TEST(StreamCallMoves, ReadSideAndEnd) {
  using R = server::StreamRead;
  using E = server::StreamEnd;
  const auto& rt = server::kStreamReadMoves;
  const auto& et = server::kStreamEndMoves;
  R r = R::idle;
  for (R to : {R::reading, R::idle, R::reading, R::ended}) rt.move(r, to);
  EXPECT_TRUE(rt.allows(R::reading, R::stopped));
  for (int b = 0; b < 4; ++b) {
    EXPECT_FALSE(rt.allows(R::ended, static_cast<R>(b))) << b;
    EXPECT_FALSE(rt.allows(R::stopped, static_cast<R>(b))) << b;
  }
  EXPECT_FALSE(rt.allows(R::idle, R::ended));  // only a pending read learns the client is done
  EXPECT_EQ(allowed(rt).size(), 4u);

  E e = E::open;
  for (E to : {E::draining, E::cancelled, E::finished}) et.move(e, to);
  EXPECT_TRUE(et.allows(E::open, E::finished));  // the client half-closed, all answered
  EXPECT_TRUE(et.allows(E::open, E::broken));
  EXPECT_FALSE(et.allows(E::cancelled, E::broken));  // the first of the two stays
  EXPECT_FALSE(et.allows(E::broken, E::cancelled));
  EXPECT_FALSE(et.allows(E::cancelled, E::draining));
  for (int b = 0; b < 5; ++b) EXPECT_FALSE(et.allows(E::finished, static_cast<E>(b))) << b;
  EXPECT_EQ(allowed(et).size(), 9u);
}

TEST(StreamCallMovesDeathTest, IllegalChangesAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto e = server::StreamEnd::finished;
        server::kStreamEndMoves.move(e, server::StreamEnd::broken);
      },
      "gRPC stream end finished -> broken: not in the table");
  EXPECT_DEATH(
      {
        auto r = server::StreamRead::idle;
        server::kStreamReadMoves.move(r, server::StreamRead::stopped);
      },
      "gRPC stream read side idle -> stopped: not in the table");
}

// ---- the gRPC frontend ------------------------------------------------------------------------

TEST(GrpcServerLifeMoves, DrainThenStopOrStopAtOnce) {
  using L = server::ServerLife;
  const auto& t = server::kServerLifeMoves;
  L l = L::serving;
  // stop_accepting, Shutdown returns while the server drains, then stop.
  for (L to : {L::draining, L::drained, L::stopped}) t.move(l, to);
  EXPECT_EQ(l, L::stopped);
  l = L::serving;
  // stop without a drain: Shutdown returns while stop waits for it.
  for (L to : {L::stopping, L::stopped}) t.move(l, to);
  EXPECT_TRUE(t.allows(L::draining, L::stopping));  // stop before the calls have ended
  EXPECT_FALSE(t.allows(L::serving, L::drained));   // Shutdown starts with a drain or a stop
  EXPECT_FALSE(t.allows(L::drained, L::stopping));  // nothing is left to wait for
  for (int b = 0; b < 5; ++b) EXPECT_FALSE(t.allows(L::stopped, static_cast<L>(b))) << b;
  EXPECT_EQ(allowed(t).size(), 6u);
}

TEST(GrpcServerLifeMovesDeathTest, IllegalChangesAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto l = server::ServerLife::stopped;
        server::kServerLifeMoves.move(l, server::ServerLife::draining);
      },
      "gRPC server stopped -> draining: not in the table");
}

// ---- an enum's names --------------------------------------------------------------------------

enum class Color : std::uint8_t { red, green };
constexpr detail::EnumNames<Color, 2> kColorNames{{"red", "green"}, "no color"};

TEST(EnumNames, NameAndParseUseOneTable) {
  static_assert(kColorNames.name(Color::green) == "green");
  EXPECT_EQ(kColorNames.name(Color::red), "red");
  EXPECT_EQ(kColorNames.name(static_cast<Color>(7)), "no color");
  EXPECT_EQ(kColorNames.parse("green"), Color::green);
  EXPECT_EQ(kColorNames.parse("Green"), std::nullopt);  // case-sensitive
  EXPECT_EQ(kColorNames.parse(""), std::nullopt);
  EXPECT_EQ(kColorNames.size(), 2u);
}

}  // namespace
}  // namespace asyncinfer
