// grpc_server_state.hpp — where the gRPC frontend (GrpcServer::Impl, grpc_server_impl.hpp) is in
// its life: an enum and its table of legal moves (asyncinfer/detail/transitions.hpp).
// GrpcServer::Impl::set_life_locked() is the only place it changes; an illegal change aborts,
// naming both states.
//
//   serving --stop_accepting--> draining --Shutdown returned--> drained --stop--> stopped
//   serving | draining --stop--> stopping --Shutdown returned--> stopped
//
// draining: the acceptor takes no new connections, grpc::Server::Shutdown runs on its own thread
// (GOAWAY to the clients) and the calls in progress go on; drained: Shutdown returned before
// stop(); stopping: stop() ends what is left and waits for Shutdown to return. Health is
// NOT_SERVING, and a new ModelStreamInfer call starts draining, in every state but serving.
//
// Thread safety: constants; the state itself lives in GrpcServer::Impl (an atomic, changed under
// its mu, read anywhere).
#pragma once

#include <cstdint>

#include "asyncinfer/detail/transitions.hpp"

namespace asyncinfer::server {

/// Where the gRPC frontend is in its life (the header's diagram).
enum class ServerLife : std::uint8_t { serving, draining, drained, stopping, stopped };

inline constexpr detail::Transitions<ServerLife, 5> kServerLifeMoves{
    "gRPC server",
    {"serving", "draining", "drained", "stopping", "stopped"},
    {
        {ServerLife::serving, ServerLife::draining},
        {ServerLife::serving, ServerLife::stopping},
        {ServerLife::draining, ServerLife::drained},
        {ServerLife::draining, ServerLife::stopping},
        {ServerLife::drained, ServerLife::stopped},
        {ServerLife::stopping, ServerLife::stopped},
    }};

}  // namespace asyncinfer::server
