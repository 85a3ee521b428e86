// http_session_state.hpp — where an HTTP connection (Session, http_server_impl.hpp) is in its
// life, and where its generate_stream response is: two enums and their tables of legal moves
// (asyncinfer/detail/transitions.hpp). Session::set_phase() and Session::set_sse() are the only
// places they change; an illegal change aborts, naming both states.
//
// A connection's phase (SessionPhase):
//
//   idle → header → [body →] handling → writing → idle (keep-alive: the next request)
//                                             writing → lingering → closed
//
//   - idle → idle: start() enters the first wait; idle → writing: a connection refused at the
//     connection limit is answered 429 at once; idle → lingering: --idle-timeout passed;
//   - header → handling: a request without a body; header|body → writing: answered without the
//     engine (a refusal, an error, an endpoint answered on the I/O thread);
//   - handling → handling: a large body is decoded off the I/O thread, then its request runs;
//   - writing → idle, or → lingering when the connection does not stay open;
//   - any phase → closed (close(): an error, the client gone, stop, drain of an idle one).
//
// A generate_stream response (SseState): none → header (its header is being written) → events
// (written as the model sends them) → final (the final response came: the events left, then the
// last chunk) → last (the last chunk is being written) → none (the stream is whole; the next
// request of the connection may stream again). header → final: the final response came while
// the header was being written. A session closed mid-stream stays where it was (a closed session
// writes nothing more).
//
// Why a connection ends before the client ends it (CloseReason), strongest last: none →
// draining (the server drains: the connection closes after the current response) → timed_out (a
// deadline passed: a read it cut is answered 408, anything else closes) → client_gone (the client
// went away while its request was handled or answered: what comes back closes the connection
// instead of being written). A stronger reason replaces a weaker one, never the reverse (the
// session keeps the stronger and ignores the weaker); the one way back is timed_out → none, when a
// new deadline is set (a drain is then still known from the server's own flag).
//
// Thread safety: constants; the states themselves live in a Session, on its I/O thread.
#pragma once

#include <cstdint>

#include "asyncinfer/detail/transitions.hpp"

namespace asyncinfer::server {

/// Where a connection is in its life (the header's diagram).
enum class SessionPhase : std::uint8_t {
  idle,       ///< between requests: waiting for the next one's first bytes
  header,     ///< reading a request's header
  body,       ///< reading its body
  handling,   ///< the request is being decoded or run (the engine, the repository)
  writing,    ///< writing its response (or a generate_stream's events)
  lingering,  ///< sending is shut down; what the client still sends is discarded, for kLinger
  closed,     ///< the socket is closed; every handler still pending returns at once
};

inline constexpr detail::Transitions<SessionPhase, 7> kSessionPhaseMoves{
    "HTTP session phase",
    {"idle", "header", "body", "handling", "writing", "lingering", "closed"},
    {
        {SessionPhase::idle, SessionPhase::idle},
        {SessionPhase::idle, SessionPhase::header},
        {SessionPhase::idle, SessionPhase::writing},
        {SessionPhase::idle, SessionPhase::lingering},
        {SessionPhase::idle, SessionPhase::closed},
        {SessionPhase::header, SessionPhase::body},
        {SessionPhase::header, SessionPhase::handling},
        {SessionPhase::header, SessionPhase::writing},
        {SessionPhase::header, SessionPhase::closed},
        {SessionPhase::body, SessionPhase::handling},
        {SessionPhase::body, SessionPhase::writing},
        {SessionPhase::body, SessionPhase::closed},
        {SessionPhase::handling, SessionPhase::handling},
        {SessionPhase::handling, SessionPhase::writing},
        {SessionPhase::handling, SessionPhase::closed},
        {SessionPhase::writing, SessionPhase::idle},
        {SessionPhase::writing, SessionPhase::lingering},
        {SessionPhase::writing, SessionPhase::closed},
        {SessionPhase::lingering, SessionPhase::closed},
    }};

/// Where a generate_stream response is (the header's diagram).
enum class SseState : std::uint8_t {
  none,    ///< no event stream: nothing of it written yet (or the last one is whole)
  header,  ///< its header (200, text/event-stream, chunked) is being written
  events,  ///< the header is written; each response is written as an event as it comes
  final,   ///< the final response came: the events still queued, then the last chunk
  last,    ///< the last chunk is being written
};

inline constexpr detail::Transitions<SseState, 5> kSseMoves{
    "generate_stream state",
    {"none", "header", "events", "final", "last"},
    {
        {SseState::none, SseState::header},
        {SseState::header, SseState::events},
        {SseState::header, SseState::final},
        {SseState::events, SseState::final},
        {SseState::final, SseState::last},
        {SseState::last, SseState::none},
    }};

/// Why a connection ends early, if it does (the header's list).
enum class CloseReason : std::uint8_t {
  none,         ///< nothing ends the connection before the client does
  draining,     ///< the server drains (Session::on_drain): close after the current response
  timed_out,    ///< the deadline passed: the read it cancelled is answered 408
  client_gone,  ///< the client went away while its request was handled or answered
};

inline constexpr detail::Transitions<CloseReason, 4> kCloseReasonMoves{
    "HTTP session close reason",
    {"none", "draining", "timed_out", "client_gone"},
    {
        {CloseReason::none, CloseReason::draining},
        {CloseReason::none, CloseReason::timed_out},
        {CloseReason::none, CloseReason::client_gone},
        {CloseReason::draining, CloseReason::timed_out},
        {CloseReason::draining, CloseReason::client_gone},
        {CloseReason::timed_out, CloseReason::none},
        {CloseReason::timed_out, CloseReason::client_gone},
    }};

/// What the current request of a connection asks for: an inference's latency is observed when its
/// response is written; generate_stream answers with events. Set once a request is whole
/// (on_request: other) and by its handler (handle_infer, handle_generate); not a life cycle.
enum class RequestKind : std::uint8_t {
  other,            ///< not an inference: metadata, health, the repository, /metrics, …
  infer,            ///< POST …/infer
  generate,         ///< POST …/generate
  generate_stream,  ///< POST …/generate_stream
};

}  // namespace asyncinfer::server
