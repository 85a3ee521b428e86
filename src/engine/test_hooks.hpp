// test_hooks.hpp (internal) — fault injection points for the engine's tests. Never set in
// production code; each hook costs one relaxed atomic load when unset.
#pragma once

#include <string>

#include "asyncinfer/engine.hpp"

namespace asyncinfer::detail {

/// Called for each request while its batch is assembled (on the worker thread); may throw, which
/// fails that request alone. nullptr = no hook.
using AssemblyHook = void (*)(const Inputs& inputs);
void set_assembly_hook(AssemblyHook hook) noexcept;
AssemblyHook assembly_hook() noexcept;

/// Called by submit(id, ...) after the id is registered and before the request is accepted (on
/// the submitting thread, no lock held): the window where a cancel(id) ends a request that is
/// not accepted yet. nullptr = no hook.
using SubmitHook = void (*)(const std::string& id);
void set_submit_hook(SubmitHook hook) noexcept;
SubmitHook submit_hook() noexcept;

}  // namespace asyncinfer::detail
