// test_hooks.hpp (internal) — fault injection points for the engine's tests. Never set in
// production code; each hook costs one relaxed atomic load when unset.
#pragma once

#include "asyncinfer/engine.hpp"

namespace asyncinfer::detail {

/// Called for each request while its batch is assembled (on the worker thread); may throw, which
/// fails that request alone. nullptr = no hook.
using AssemblyHook = void (*)(const Inputs& inputs);
void set_assembly_hook(AssemblyHook hook) noexcept;

}  // namespace asyncinfer::detail
