// How a body becomes an inner onnxruntime session on the process's env: the env's one shared CPU
// arena, the env's global intra-op pool where it has one (else a pool per session), the thread
// count, the exact-INT8 session entry, the shared weights handed in as external initializers,
// and the process-wide thread report (OnnxmluThreadReport) those choices feed.
#pragma once

#include <array>
#include <atomic>
#include <string>
#include <vector>

#include "attributes.h"
#include "ort_support.h"

namespace onnxmlu {

// Hardware threads this process may use (the CPU affinity mask where it is narrower).
int64_t HardwareThreads();
// Thread count of an inner session: the environment override, else the registration's
// setting (the user's thread budget), else the block's MP capped at the hardware threads.
int InnerThreads(int64_t mp, const InnerConfig& config, const std::string& prefix);

// Text of the error the nested-op variant raises; the outer kernel recognises it.
inline constexpr const char* kNestedMessage = "blocks cannot be nested";
// The domain of the nested-op variant registered inside every body (registration.cc).
OrtCustomOpDomain* NestedDomain();

// Registers one CPU arena on `env` for every inner session of the process (once per env).
void ShareCpuArena(OrtEnv* env) noexcept;

// The thread report's counters (OnnxmluThreadReport, indices as documented in the header).
extern std::array<std::atomic<int64_t>, 5> g_thread_report;
enum ReportIndex { kOwnPools, kOwnWorkers, kGlobalSessions, kOwnPoolRuns, kGlobalRuns };

// Whether onnxruntime refused the body because of the exact-INT8 session entry (retry without).
bool IsExactInt8Failure(const std::string& message);
// Says, once per block and session (the kernel is made once: not per run), through onnxruntime's logger at warning level, that the block was retried
// without exact INT8 kernels (IsExactInt8Failure's `message`) and may saturate on this CPU.
void WarnExactInt8Retry(const OrtKernelInfo* info, const std::string& node_name, const std::string& message) noexcept;

// The shared weights as onnxruntime takes them (AddExternalInitializers: tensors over a buffer
// they do not own), made once per kernel and kept until its inner session is made.
struct SharedViews {
  std::vector<OrtPtr<OrtValue>> views;
  std::vector<const char*> names;
  std::vector<const OrtValue*> values;
};
SharedViews ViewsOf(const SharedWeights& shared, const std::string& prefix);

// The inner session of a body: on the env's global pool where it has one (or the user demands
// it), so every block of every model in the process shares one pool as the process's plain
// sessions do; otherwise on a pool of its own. Returns onnxruntime's error for the body, if any.
OrtStatus* CreateInnerSession(OrtEnv* env, std::string_view body, int threads, const InnerConfig& config,
                              const std::string& node_name, const std::string& prefix, const SharedViews& shared,
                              OrtSession** session, bool* on_global_pool, bool exact_int8);

}  // namespace onnxmlu
