#include "inner_session.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>

namespace onnxmlu {

std::array<std::atomic<int64_t>, 5> g_thread_report{};

// The CPU affinity mask (containers, taskset) when it is narrower than what
// std::thread::hardware_concurrency reports.
int64_t HardwareThreads() {
  int64_t threads = std::thread::hardware_concurrency();
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int64_t allowed = CPU_COUNT(&set);
    if (allowed > 0 && (threads == 0 || allowed < threads)) threads = allowed;
  }
  return threads > 0 ? threads : 1;
}

int InnerThreads(int64_t mp, const InnerConfig& config, const std::string& prefix) {
  if (const char* text = std::getenv(kInnerThreadsEnv); text != nullptr && *text != '\0') {
    char* end = nullptr;
    errno = 0;
    long value = std::strtol(text, &end, 10);
    if (errno != 0 || *end != '\0' || value < 0 || value > 4096) {
      throw BlockError(ORT_INVALID_ARGUMENT, prefix + kInnerThreadsEnv + " must be a non-negative integer, got '" + text + "'");
    }
    return static_cast<int>(value);
  }
  if (config.threads > 0) return config.threads;
  return static_cast<int>(std::min<int64_t>(mp, HardwareThreads()));
}

// One CPU arena for every inner session of the process, registered on the env (the process's
// env: CreateEnv returns it). Each inner session with its own arena touches its own memory, and
// consecutive blocks then run from cold cache lines: MobileNetV2 dlfusion (6 blocks, 1 thread)
// chained as separate sessions took 4629 us with one arena each, 4386 us with one shared arena;
// fused/original in bench_runtime went from 1.07-1.09x to 1.03-1.04x there.
// BFCArena is thread-safe, so concurrent Runs can share it. If the env already has a CPU
// allocator (the user registered one), CreateAndRegisterAllocator fails and the inner sessions
// use that one. Tried once per env (the env only changes if every session and the env were
// released and a new env was made); never fails kernel creation: without a shared allocator
// "session.use_env_allocators" just leaves each session its own arena.
void ShareCpuArena(OrtEnv* env) noexcept {
  static std::mutex mutex;
  static const OrtEnv* registered_on = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (env == registered_on) return;
  registered_on = env;
  OrtMemoryInfo* memory_info = nullptr;
  if (OrtStatus* status = Api().CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &memory_info)) {
    Api().ReleaseStatus(status);
    return;
  }
  // nullptr arena config: onnxruntime's defaults, the same as a session's own CPU arena.
  if (OrtStatus* status = Api().CreateAndRegisterAllocator(env, memory_info, nullptr)) {
    Api().ReleaseStatus(status);  // already registered (by the user or an earlier env): use it
  }
  Api().ReleaseMemoryInfo(memory_info);
}


namespace {

// Whether the process env was created with global thread pools (CreateEnvWithGlobalThreadPools,
// or Python's set_global_thread_pool_sizes before the first session). onnxruntime offers no
// query, and only its user can set it up (before the env exists), so the library detects it:
// a session with per-session threads disabled can be created only on such an env (onnxruntime
// refuses it in the session's constructor, before reading the model, on any other). The first
// inner session of an env tries that; the answer holds for the env's life.
class GlobalPoolCache {
 public:
  std::optional<bool> Known(const OrtEnv* env) {
    std::lock_guard<std::mutex> lock(mutex_);
    return env == env_ ? has_pool_ : std::nullopt;
  }
  void Remember(const OrtEnv* env, bool has_pool) {
    std::lock_guard<std::mutex> lock(mutex_);
    env_ = env;
    has_pool_ = has_pool;
  }

 private:
  std::mutex mutex_;
  const OrtEnv* env_ = nullptr;  // the env only changes once every session and the env were released
  std::optional<bool> has_pool_;
};

GlobalPoolCache& GlobalPools() {
  static GlobalPoolCache cache;
  return cache;
}

// Exact INT8 on every x86 CPU: without VNNI, onnxruntime's u8 x s8 kernels add pairs of 8-bit
// products in 16 bits and saturate; with this entry its optimizer gives constant s8 weights
// u8 (+128, the same integers) and runs u8 x u8 kernels, which accumulate exactly in 32 bits
// (see onnxmlu/sessions.py). onnxruntime applies it on VNNI hosts too, whose u8 x s8 kernels
// are exact already (vpdpbusd sums four products in 32 bits): the same integers from kernels
// measured 1.2-2.1x slower there, so it is set only where the default kernels saturate.
constexpr const char* kExactInt8Key = "session.x64quantprecision";

// As MLAS dispatches: AVX-512 VNNI usable (CPUID and the OS's AVX-512 state) gives exact u8 x s8
// kernels; the entry is x86-only.
bool DefaultKernelsExact() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("avx512vnni");
#else
  return true;
#endif
}
// Two failures of that rewrite in onnxruntime 1.32, after which the body loads without it:
// an s8-activation QLinearConv/QLinearMatMul gets a u8 weight and then no kernel (its own
// s8 x s8 kernel is exact without the entry), and a weight shared by several nodes is added
// twice (then the body's u8 x s8 products run the saturating kernels). The fuse writes bodies
// without the second (onnxmlu/sessions.py: unshare_dequantized_weights), so that retry serves
// files written elsewhere, and says so (WarnExactInt8Retry); kExactInt8StrictEnv = "1" turns it
// into the error instead, which tests/precision/test_exact_int8.py sets under an emulated AVX2
// CPU to show that the package's own fuses never need it.
constexpr const char* kS8ActivationFailure = "Failed to find kernel";
constexpr const char* kSharedWeightFailure = "Attempt to replace the existing tensor";
constexpr const char* kExactInt8StrictEnv = "ONNXMLU_EXACT_INT8_STRICT";

bool Strict() {
  const char* strict = std::getenv(kExactInt8StrictEnv);
  return strict != nullptr && std::string(strict) == "1";
}

}  // namespace

bool IsExactInt8Failure(const std::string& message) {
  if (message.find(kS8ActivationFailure) != std::string::npos) return true;
  return message.find(kSharedWeightFailure) != std::string::npos && !Strict();
}

void WarnExactInt8Retry(const OrtKernelInfo* info, const std::string& node_name, const std::string& message) noexcept {
  if (message.find(kSharedWeightFailure) == std::string::npos) return;  // s8 x s8 nodes: exact without the entry
  const OrtLogger* logger = nullptr;
  if (OrtStatus* status = Api().KernelInfo_GetLogger(info, &logger)) {
    Api().ReleaseStatus(status);
    return;
  }
  const std::string text = "MLUFusionBlock '" + node_name + "': onnxruntime could not load the body with exact INT8 kernels (" +
                           kExactInt8Key + " = 1 fails on a quantized weight that several nodes share), so it runs "
                           "onnxruntime's default kernels, whose INT8 arithmetic may saturate on this CPU (x86 without "
                           "AVX-512 VNNI); a fuse of the original model by onnxmlu gives each reader its own copy.";
  if (OrtStatus* status = Api().Logger_LogMessage(logger, ORT_LOGGING_LEVEL_WARNING, text.c_str(), __FILE__, __LINE__, __func__)) {
    Api().ReleaseStatus(status);
  }
}

namespace {

// A tensor over `value`'s buffer that does not own it.
OrtPtr<OrtValue> ViewOf(const OrtValue* value, const std::string& prefix) {
  OrtTensorTypeAndShapeInfo* raw = nullptr;
  Check(Api().GetTensorTypeAndShape(value, &raw), prefix);
  OrtPtr<OrtTensorTypeAndShapeInfo> info(raw);
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  Check(Api().GetTensorElementType(info.get(), &type), prefix);
  const auto [dims, count] = ShapeOf(value, prefix);
  void* data = nullptr;
  Check(Api().GetTensorMutableData(const_cast<OrtValue*>(value), &data), prefix);  // only read
  const OrtMemoryInfo* memory = nullptr;
  Check(Api().GetTensorMemoryInfo(value, &memory), prefix);
  const size_t bits = ElementBits(type);
  if (bits == 0) throw BlockError(ORT_INVALID_GRAPH, prefix + "a shared weight of type " + TypeName(type) + " cannot be shared");
  OrtValue* view = nullptr;
  Check(Api().CreateTensorWithDataAsOrtValue(memory, data, (count * bits + 7) / 8, dims.data(), dims.size(), type, &view),
        prefix);
  return OrtPtr<OrtValue>(view);
}

}  // namespace

SharedViews ViewsOf(const SharedWeights& shared, const std::string& prefix) {
  SharedViews result;
  for (size_t i = 0; i < shared.names.size(); ++i) {
    result.views.push_back(ViewOf(shared.values[i], prefix));
    result.names.push_back(shared.names[i].c_str());
    result.values.push_back(result.views.back().get());
  }
  return result;
}

namespace {

// The body's placeholders, replaced before onnxruntime optimizes the graph (the inner session
// copies the data in, so the views may go once it is made).
void AddShared(OrtSessionOptions* options, const SharedViews& shared, const std::string& prefix) {
  if (shared.names.empty()) return;
  Check(Api().AddExternalInitializers(options, shared.names.data(), shared.values.data(), shared.names.size()), prefix);
}

OrtPtr<OrtSessionOptions> InnerSessionOptions(int threads, bool spinning, bool global_pool, const std::string& node_name,
                                              const std::string& prefix, bool exact_int8 = true) {
  OrtSessionOptions* raw = nullptr;
  Check(Api().CreateSessionOptions(&raw), prefix);
  OrtPtr<OrtSessionOptions> options(raw);
  Check(Api().SetIntraOpNumThreads(options.get(), threads), prefix);
  Check(Api().SetInterOpNumThreads(options.get(), 1), prefix);
  // Blocks run one after another, so one inner pool works at a time. Spinning while a block
  // runs saves a thread wake-up per parallel kernel (ResNet-18 at 2 threads: 1.06-1.10x of the
  // original without it, 0.99-1.04x with it), but a finished block's pool must stop spinning at
  // once or it steals a core from the next block's pool (dlfusion ResNet-18: 1.4-1.5x).
  Check(Api().AddSessionConfigEntry(options.get(), "session.intra_op.allow_spinning", spinning ? "1" : "0"), prefix);
  Check(Api().AddSessionConfigEntry(options.get(), "session.force_spinning_stop", "1"), prefix);
  Check(Api().AddSessionConfigEntry(options.get(), "session.inter_op.allow_spinning", "0"), prefix);
  // With global pools (kInnerGlobalPoolKey) every block runs on the env's one intra-op pool;
  // onnxruntime then ignores force_spinning_stop, and the single pool spins across blocks as a
  // plain session's pool does across its kernels.
  if (global_pool) Check(Api().DisablePerSessionThreads(options.get()), prefix);
  // onnxruntime's own fusions (BN folding, NCHWc, Conv+Act) are wanted inside a block.
  Check(Api().SetSessionGraphOptimizationLevel(options.get(), ORT_ENABLE_ALL), prefix);
  Check(Api().SetSessionLogId(options.get(), ("onnxmlu:" + node_name).c_str()), prefix);
  Check(Api().AddCustomOpDomain(options.get(), NestedDomain()), prefix);
  // The env's shared CPU arena (ShareCpuArena) instead of an arena per inner session.
  Check(Api().AddSessionConfigEntry(options.get(), "session.use_env_allocators", "1"), prefix);
  if (exact_int8 && !DefaultKernelsExact()) Check(Api().AddSessionConfigEntry(options.get(), kExactInt8Key, "1"), prefix);
  return options;
}

}  // namespace

OrtStatus* CreateInnerSession(OrtEnv* env, std::string_view body, int threads, const InnerConfig& config,
                              const std::string& node_name, const std::string& prefix, const SharedViews& shared,
                              OrtSession** session, bool* on_global_pool, bool exact_int8) {
  std::optional<bool> global = GlobalPools().Known(env);
  if (config.global_pool != GlobalPool::kDetect) global = config.global_pool == GlobalPool::kRequire;
  if (!global.has_value()) {  // the env's first block: try the global pool
    auto options = InnerSessionOptions(threads, config.spinning, /*global_pool=*/true, node_name, prefix, exact_int8);
    AddShared(options.get(), shared, prefix);
    OrtStatus* status = Api().CreateSessionFromArray(env, body.data(), body.size(), options.get(), session);
    if (status == nullptr) {
      GlobalPools().Remember(env, true);
      *on_global_pool = true;
      return nullptr;
    }
    Api().ReleaseStatus(status);  // no global pool, or a bad body: the per-session try below says which
  }
  *on_global_pool = global.value_or(false);
  auto options = InnerSessionOptions(threads, config.spinning, *on_global_pool, node_name, prefix, exact_int8);
  AddShared(options.get(), shared, prefix);
  OrtStatus* status = Api().CreateSessionFromArray(env, body.data(), body.size(), options.get(), session);
  if (status == nullptr && !global.has_value()) GlobalPools().Remember(env, false);  // the body is fine: no pool
  return status;
}

}  // namespace onnxmlu
