// grpc_stream_state.hpp — where a ModelStreamInfer call (StreamCall, grpc_stream_call.cpp) is:
// its read side and its end, two enums and their tables of legal moves
// (asyncinfer/detail/transitions.hpp). StreamCall::set_read() and StreamCall::set_end() are the
// only places they change; an illegal change aborts, naming both states.
//
// The read side (StreamRead): idle ⇄ reading (one read at a time; next_locked() starts one while
// the stream is open and has room), then, from reading, ended (OnReadDone(false): the client
// half-closed, or the call ended) or stopped (a malformed message: the server reads no more). A
// message read while the call finished is dropped (reading → idle, and no read follows).
//
// The call's end (StreamEnd): open → draining (the server drains: no more reads; Finish once what
// was accepted is answered) → finished (Finish is started: decided by next_locked() once nothing
// runs or waits to be written). Before finished, cancelled (OnCancel: the client cancelled or
// the deadline passed) or broken (a write failed: the client is gone) stop all writing: what
// runs is cancelled, Finish(CANCELLED) once it has ended. The first of cancelled and broken
// stays (they mean the same to the call); once finished, a late cancel changes nothing.
//
// Thread safety: constants; the states themselves live in a StreamCall, under its mu_.
#pragma once

#include <cstdint>

#include "asyncinfer/detail/transitions.hpp"

namespace asyncinfer::server {

/// The read side of a ModelStreamInfer call (the header).
enum class StreamRead : std::uint8_t {
  idle,     ///< no read pending; one may start
  reading,  ///< a read is pending (StartRead … OnReadDone)
  ended,    ///< no more messages: the client half-closed, or the call ended
  stopped,  ///< a malformed message: the server reads no more (the stream ends with its error)
};

inline constexpr detail::Transitions<StreamRead, 4> kStreamReadMoves{
    "gRPC stream read side",
    {"idle", "reading", "ended", "stopped"},
    {
        {StreamRead::idle, StreamRead::reading},
        {StreamRead::reading, StreamRead::idle},
        {StreamRead::reading, StreamRead::ended},
        {StreamRead::reading, StreamRead::stopped},
    }};

/// How far a ModelStreamInfer call is towards its end (the header).
enum class StreamEnd : std::uint8_t {
  open,       ///< reading and answering
  draining,   ///< the server drains: no more reads; the accepted requests are answered
  cancelled,  ///< OnCancel (the client, or the deadline): nothing more is written
  broken,     ///< a write failed (the client is gone): nothing more is written
  finished,   ///< Finish is started (or was, by the time a late cancel arrives)
};

inline constexpr detail::Transitions<StreamEnd, 5> kStreamEndMoves{
    "gRPC stream end",
    {"open", "draining", "cancelled", "broken", "finished"},
    {
        {StreamEnd::open, StreamEnd::draining},
        {StreamEnd::open, StreamEnd::cancelled},
        {StreamEnd::open, StreamEnd::broken},
        {StreamEnd::open, StreamEnd::finished},
        {StreamEnd::draining, StreamEnd::cancelled},
        {StreamEnd::draining, StreamEnd::broken},
        {StreamEnd::draining, StreamEnd::finished},
        {StreamEnd::cancelled, StreamEnd::finished},
        {StreamEnd::broken, StreamEnd::finished},
    }};

}  // namespace asyncinfer::server
