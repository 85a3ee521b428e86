// detail/transitions.hpp — a checked state machine: the legal changes of state of an enum as a
// table, and the one check that every change goes through.
//
// A life cycle (the engine's, a request's, an HTTP session's, a gRPC stream's) is an enum whose
// values 0..N-1 are its states; its Transitions lists the legal moves once, next to the enum, so
// the diagram in a comment and the code cannot drift apart. Every change of state calls move()
// (or check() where the change itself is made otherwise, e.g. by a compare-and-swap); a move
// that is not in the table is a bug in the caller: reported on stderr ("asyncinfer: internal
// error: <what> <from> -> <to>: <why>") and the process aborted, in every build type.
//
//   enum class Door : std::uint8_t { open, closed, locked };
//   inline constexpr Transitions<Door, 3> kDoorMoves{
//       "door", {"open", "closed", "locked"},
//       {{Door::open, Door::closed}, {Door::closed, Door::open}, {Door::closed, Door::locked}}};
//   kDoorMoves.move(door_, Door::locked);  // aborts unless door_ is closed
//
// Thread safety: a Transitions is immutable (constexpr); move() changes the caller's variable,
// under whatever rule guards it (a strand, a mutex: the caller's doc comment says which).
#pragma once

#include <array>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <utility>

namespace asyncinfer::detail {

/// Reports an illegal change of state (a bug in the caller) and aborts the process.
[[noreturn]] inline void illegal_transition(const char* what, const char* from, const char* to,
                                            const char* why) noexcept {
  std::fprintf(stderr, "asyncinfer: internal error: %s %s -> %s: %s\n", what, from, to, why);
  std::abort();
}

/// The legal moves between the N states (values 0..N-1) of enum E, with the states' names for
/// the message of an illegal one. Built at compile time from the list of legal moves.
template <class E, std::size_t N>
class Transitions {
 public:
  using Move = std::pair<E, E>;

  /// `what` names the state machine in messages ("HTTP session phase"); `names[i]` names state
  /// i; `legal` lists the legal (from, to) moves — every other move is illegal.
  constexpr Transitions(const char* what, std::array<const char*, N> names,
                        std::initializer_list<Move> legal)
      : what_(what), names_(names) {
    for (const Move& m : legal) legal_[index(m.first)][index(m.second)] = true;
  }

  /// Whether from → to is in the table.
  constexpr bool allows(E from, E to) const noexcept {
    return index(from) < N && index(to) < N && legal_[index(from)][index(to)];
  }

  /// Aborts (illegal_transition, naming from and to) unless from → to is in the table.
  constexpr void check(E from, E to) const noexcept {
    if (!allows(from, to)) fail(from, to, "not in the table");
  }

  /// Checks state → to, then makes it.
  constexpr void move(E& state, E to) const noexcept {
    check(state, to);
    state = to;
  }

  /// Reports from → to as illegal for `why` and aborts (for a rule beyond the table's, such as
  /// a lock that must be held).
  [[noreturn]] void fail(E from, E to, const char* why) const noexcept {
    illegal_transition(what_, name(from), name(to), why);
  }

  constexpr const char* name(E s) const noexcept { return index(s) < N ? names_[index(s)] : "?"; }
  constexpr const char* what() const noexcept { return what_; }

 private:
  static constexpr std::size_t index(E s) noexcept { return static_cast<std::size_t>(s); }

  const char* what_;
  std::array<const char*, N> names_;
  bool legal_[N][N] = {};
};

}  // namespace asyncinfer::detail
