#include "engine/test_hooks.hpp"

#include <atomic>

namespace asyncinfer::detail {
namespace {
std::atomic<AssemblyHook> g_assembly_hook{nullptr};
std::atomic<SubmitHook> g_submit_hook{nullptr};
}  // namespace

void set_assembly_hook(AssemblyHook hook) noexcept { g_assembly_hook.store(hook); }
AssemblyHook assembly_hook() noexcept { return g_assembly_hook.load(std::memory_order_acquire); }
void set_submit_hook(SubmitHook hook) noexcept { g_submit_hook.store(hook); }
SubmitHook submit_hook() noexcept { return g_submit_hook.load(std::memory_order_relaxed); }

}  // namespace asyncinfer::detail
