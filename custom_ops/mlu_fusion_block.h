// MLUFusionBlock: the custom op that runs one fused block of an onnxmlu model.
//
// A fused model keeps each block as a single `com.onnxmlu::MLUFusionBlock` node whose `body`
// attribute is the block itself, serialized as an ONNX ModelProto (TENSOR(uint8), or STRING for
// compatibility). At kernel creation the body becomes an inner onnxruntime session on the
// process's env, allocating from one CPU arena the library registers on that env for all inner
// sessions (or the user's env allocator, if one was registered first); Compute hands the node's
// inputs to that session unchanged and lets it write straight into the node's outputs when their
// shapes are static, or learned: a body whose output shapes follow its input shapes (metadata
// kOutputShapesKey) remembers the output shapes of each set of input shapes it ran at and, at
// those shapes again, allocates the outputs before the inner Run. `mp` (the block's core count
// on the simulated accelerator) sets the inner session's intra-op thread count. The inner session
// runs on the env's global intra-op pool where the process created its env with one (detected,
// see kInnerGlobalPoolKey), else on a pool of its own; OnnxmluThreadReport counts them. Node
// inputs and outputs map to the body's graph inputs and outputs by position.
//
// `body_crc32` (INT, optional: files written before it existed have none) is the CRC-32 of the
// body's bytes; a body whose bytes do not match it is refused before it is parsed, so a bit flip
// in a weight fails session creation instead of running with the wrong weight.
//
// A body must hold its weights inline: one with a tensor in external data (a file reference,
// which an inner session made from bytes would resolve against the working directory) is refused
// before onnxruntime parses it, and so is one nesting messages deeper than protobuf parses.
//
// Everything that can go wrong with a node (bad `mp`, missing, corrupt or file-reading body,
// body/node mismatch, nested blocks, string tensors at the boundary) is reported as an OrtStatus from
// CreateKernelV2, so onnxruntime fails session creation with a readable message instead of the
// process crashing. Nothing throws across the C boundary.
//
// The library's units (each with a header): crc32 (the digest), utf8 (message repair), body_scan
// (the body read in protobuf's wire format, in place), label_rule (what a precision label needs
// of the body) -- these four free of onnxruntime, so tests/cpp links them alone -- then
// ort_support (errors and statuses), attributes (the node's attributes), inner_session (env,
// arena, pools, session options), mlu_fusion_block.cc (this kernel) and registration.
#pragma once

#ifndef ORT_API_MANUAL_INIT
#define ORT_API_MANUAL_INIT  // the pip wheel does not export OrtGetApiBase; RegisterCustomOps inits the API
#endif
#include <onnxruntime_cxx_api.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dim_expr.h"

namespace onnxmlu {

inline constexpr const char* kDomain = "com.onnxmlu";
inline constexpr const char* kOpName = "MLUFusionBlock";
// Headers are onnxruntime 1.21's (API 21); newer runtimes still serve this version.
inline constexpr uint32_t kOrtApiVersion = 21;
// The optional digest attribute: CRC-32 (ISO-HDLC, zlib's crc32) of the body's bytes, 0..2^32-1.
inline constexpr const char* kDigestAttribute = "body_crc32";
// The optional count of the node's last inputs that are weights shared with other blocks
// (onnxmlu/collapse/shared.py): each is a constant of the outer graph, and the body holds an
// initializer of the same name whose data is an external reference to kSharedLocation. The
// kernel hands each constant to the inner session in place of that reference, so the weight
// is stored once in the file and the inner session still sees an initializer.
inline constexpr const char* kSharedAttribute = "shared_weights";
inline constexpr const char* kSharedLocation = "onnxmlu:outer-constant";
// More cores than any plausible accelerator profile: almost certainly a corrupt attribute.
inline constexpr int64_t kMaxMp = 1024;
// Body metadata (written by onnxmlu's collapse, onnxmlu/collapse/outputs.py): with the value
// kFollowInputShapes, every output's shape is a function of the input shapes alone, so output
// shapes seen once at a set of input shapes can be allocated before later runs at those shapes.
inline constexpr const char* kOutputShapesKey = "onnxmlu.output_shapes";
inline constexpr const char* kFollowInputShapes = "input-shapes";
// Body metadata (onnxmlu/collapse/dims.py): each output's dims as polynomials over the input dims
// (grammar in dim_expr.h). Outputs whose dims evaluate at a run's input shapes are allocated
// before the inner Run, which writes into them: no copy even where every step has new shapes (a
// KV cache growing by a token a step). A body without it (older files) copies as before.
inline constexpr const char* kOutputDimsKey = "onnxmlu.output_dims";
// Sets of input shapes a kernel remembers the output shapes of (a bound on its memory).
inline constexpr size_t kMaxLearnedShapes = 32;
// Session config entry RegisterCustomOps sets in the options it registers into ("1").
inline constexpr const char* kRegisteredKey = "onnxmlu.custom_ops_registered";
// Overrides the inner sessions' intra-op thread count (benchmarking); 0 = onnxruntime default.
inline constexpr const char* kInnerThreadsEnv = "ONNXMLU_INNER_THREADS";
// Session config entries read when the library is registered into a SessionOptions; they set
// up the inner sessions of every block of sessions created from those options.
// Intra-op threads of each inner session; "0" or absent: min(mp, hardware threads).
inline constexpr const char* kInnerThreadsKey = "onnxmlu.inner_threads";
// "1" (default): inner thread pools spin while their block runs and stop when it returns;
// "0": they never spin (better when the machine's cores are contended).
inline constexpr const char* kInnerSpinningKey = "onnxmlu.inner_spinning";
// Where inner sessions get their threads. Absent: detected per env (GlobalPool::kDetect).
// "1": the env's global intra-op pool (DisablePerSessionThreads), and session creation fails if
// the env has none; "0": a pool per inner session even where the env has a global one.
// One shared pool means no per-block wake-up of another pool's sleeping worker: MobileNetV2
// dlfusion batch 1 at 2 threads on 2 idle cores ran at 1.06-1.09x of plain onnxruntime (global
// pools both sides) against 1.28-1.36x with a pool per inner session. Thread count and spinning
// then come from the global pool's options.
inline constexpr const char* kInnerGlobalPoolKey = "onnxmlu.inner_global_pool";

enum class GlobalPool { kDetect, kRequire, kNever };

// How the blocks of one registration build their inner sessions.
struct InnerConfig {
  int threads = 0;  // 0: min(mp, hardware threads)
  bool spinning = true;
  GlobalPool global_pool = GlobalPool::kDetect;  // the env's global intra-op pool or a pool per session
  bool operator<(const InnerConfig& other) const {
    if (threads != other.threads) return threads < other.threads;
    if (spinning != other.spinning) return spinning < other.spinning;
    return global_pool < other.global_pool;
  }
};

// Releases onnxruntime C objects through the API that RegisterCustomOps initialised.
struct OrtDeleter {
  void operator()(OrtEnv* p) const { Ort::GetApi().ReleaseEnv(p); }
  void operator()(OrtSession* p) const { Ort::GetApi().ReleaseSession(p); }
  void operator()(OrtSessionOptions* p) const { Ort::GetApi().ReleaseSessionOptions(p); }
  void operator()(OrtTypeInfo* p) const { Ort::GetApi().ReleaseTypeInfo(p); }
  void operator()(OrtTensorTypeAndShapeInfo* p) const { Ort::GetApi().ReleaseTensorTypeAndShapeInfo(p); }
  void operator()(OrtValue* p) const { Ort::GetApi().ReleaseValue(p); }
  void operator()(OrtStatus* p) const { Ort::GetApi().ReleaseStatus(p); }
};
template <typename T>
using OrtPtr = std::unique_ptr<T, OrtDeleter>;

// The kernel of one MLUFusionBlock node: an inner session built from the body. Immutable after
// construction but for the learned output shapes (behind a mutex), so concurrent ComputeV2 calls
// (one outer session shared by many threads) share the inner session, whose Run is thread-safe.
class FusionBlockKernel {
 public:
  // Throws BlockError (message already prefixed with the node name) when the node is unusable.
  FusionBlockKernel(const OrtKernelInfo* info, const InnerConfig& config);
  OrtStatusPtr ComputeV2(OrtKernelContext* context) const noexcept;

 private:
  struct OutputPlan {
    bool is_static = false;       // shape fully known at creation: the inner Run writes in place
    std::vector<int64_t> dims;    // the static shape
    size_t element_bits = 0;      // for the copy of dynamically shaped outputs
    // UNDEFINED, or the body's 16-bit float type where onnxruntime reads float (see narrow_to_)
    ONNXTensorElementDataType widen_from = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    // Where the value comes from: the inner Run (its output run_index), or, for a body output that
    // is also a body input or repeats an earlier output, a copy of input / output source_index.
    enum class Source { kRun, kInput, kOutput } source = Source::kRun;
    size_t run_index = 0;
    size_t source_index = 0;
  };

  using Shapes = std::vector<std::vector<int64_t>>;

  void Compute(OrtKernelContext* context) const;
  // The shape of every dynamic output (empty for a static one), as a previous run at the same
  // input shapes gave them; nullopt when no run did (or the body's shapes follow values).
  std::optional<Shapes> LearnedShapes(const std::vector<int64_t>& key) const;
  void Learn(std::vector<int64_t> key, Shapes shapes) const;
  // Per output, its shape as the dims metadata gives it at these input shapes (nullopt where it
  // gives none); all nullopt without the metadata or once it was refused.
  using MaybeShapes = std::vector<std::optional<std::vector<int64_t>>>;
  MaybeShapes ExpressedShapes(const std::vector<const OrtValue*>& inputs) const;
  // At the kernel's first run (copied): whether the metadata's shapes are those the Run gave.
  void CheckExpressedShapes(const MaybeShapes& expressed, const Shapes& seen) const;
  // The node's outputs the inner Run writes in place (static, learned, or expressed once trusted),
  // as run results; `in_place` marks them, `from_dims` those whose shape came from the metadata.
  std::vector<OrtValue*> AllocateInPlace(OrtKernelContext* context, const std::optional<Shapes>& learned,
                                         const MaybeShapes& expressed, std::vector<bool>* in_place,
                                         bool* from_dims) const;
  void PlanOutputSources(const std::string& prefix);
  std::vector<OrtPtr<OrtValue>> Run(const std::vector<const OrtValue*>& inputs, std::vector<OrtValue*>& results,
                                    const std::vector<bool>& in_place, bool from_dims) const;
  std::vector<int64_t> CopyDynamicOutput(OrtKernelContext* context, size_t index, const OrtValue* result) const;
  OrtPtr<OrtValue> Narrow(const OrtValue* value, ONNXTensorElementDataType type) const;
  // "MLUFusionBlock '<name>': ", built once so that ComputeV2's error path needs no allocation.
  const std::string& BlockName() const { return prefix_; }

  // Counts this kernel's inner session in the thread report (OnnxmluThreadReport) while it lives.
  struct PoolUse {
    int own_workers = -1;  // worker threads of the session's own pool; -1: none counted yet
    bool global = false;   // runs on the env's global pool
    PoolUse() = default;
    PoolUse(const PoolUse&) = delete;
    PoolUse& operator=(const PoolUse&) = delete;
    void Count(int threads, bool on_global_pool);
    ~PoolUse();
  };

  std::string node_name_;
  std::string prefix_;
  int64_t mp_ = 0;
  PoolUse pool_use_;
  OrtPtr<OrtEnv> env_;          // keeps the process env alive as long as the inner session
  OrtPtr<OrtSession> session_;  // declared after env_: destroyed first
  std::vector<std::string> input_names_, output_names_;
  std::vector<const char*> input_name_ptrs_;
  std::vector<const char*> run_output_ptrs_;  // the distinct body outputs that are not inputs, for Run
  std::vector<OutputPlan> outputs_;
  bool learn_shapes_ = false;  // a dynamic output, and the body's output shapes follow its input shapes
  mutable std::mutex learned_mutex_;
  mutable std::map<std::vector<int64_t>, Shapes> learned_;  // input-shape key -> dynamic outputs' shapes
  // Per input: UNDEFINED, or the 16-bit float type the body reads where onnxruntime feeds float.
  // onnxruntime's CPU provider runs a float16 node that has no float16 kernel in float, between
  // Casts, and drops a Cast next to a node that accepts any type (this one): the block then
  // receives the float the Cast would have rounded, or must produce the float it would have
  // widened (OutputPlan::widen_from).
  std::vector<ONNXTensorElementDataType> narrow_to_;
  // Parsed kOutputDimsKey (empty: none, or malformed: the copy path) and how far it is trusted:
  // unchecked until a first run's inner shapes agreed with it; refused for good when they did not,
  // or when an inner Run refused the outputs allocated from it.
  std::vector<OutputDims> output_dims_;
  enum DimsState : int { kDimsUnchecked, kDimsTrusted, kDimsRefused };
  mutable std::atomic<int> dims_state_{kDimsUnchecked};
};

// The op definition. `nested == true` is the variant registered inside block bodies: creating
// its kernel always fails, which is how nested blocks are rejected with a clear message. Each
// distinct InnerConfig gets its own op (and domain), so sessions registered with different
// config entries build their inner sessions differently.
struct FusionBlockOp : Ort::CustomOpBase<FusionBlockOp, FusionBlockKernel, /*WithStatus=*/true> {
  FusionBlockOp(bool nested, InnerConfig config) : nested_(nested), config_(config) {}

  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const noexcept;

  const char* GetName() const { return kOpName; }
  const char* GetExecutionProviderType() const { return nullptr; }  // CPU

  // One variadic input and one variadic output of any element type, mixed types allowed.
  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t) const { return INPUT_OUTPUT_VARIADIC; }
  int GetVariadicInputMinArity() const { return 1; }
  bool GetVariadicInputHomogeneity() const { return false; }

  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t) const { return INPUT_OUTPUT_VARIADIC; }
  int GetVariadicOutputMinArity() const { return 1; }
  bool GetVariadicOutputHomogeneity() const { return false; }

 private:
  bool nested_;
  InnerConfig config_;
};

}  // namespace onnxmlu

extern "C" {
// Entry point called by onnxruntime's register_custom_ops_library / RegisterCustomOpsLibrary.
__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                              const OrtApiBase* api_base);

// What the process's inner sessions cost in threads, for tests and `onnxmlu run --profile` (one
// call, no onnxruntime needed). Writes min(count, 5) values and returns how many it knows (5):
// [0] live inner sessions with a pool of their own (more than one intra-op thread),
// [1] the worker threads those pools hold (threads - 1 each, as onnxruntime creates them),
// [2] live inner sessions on the env's global pool,
// [3] Runs so far of inner sessions with their own pool (each wakes that pool),
// [4] Runs so far of inner sessions on the global pool.
__attribute__((visibility("default"))) int64_t OnnxmluThreadReport(int64_t* values, int64_t count);

// How the process's blocks have handed their outputs back so far (for tests and profiling), the
// same calling convention with 3 values: [0] outputs copied from a result the inner session
// allocated (shape unknown before its Run), [1] outputs of a dynamic shape the inner session
// wrote in place (shapes learned, or evaluated from kOutputDimsKey), [2] kernels that stopped
// trusting their kOutputDimsKey because an inner Run disagreed with it.
__attribute__((visibility("default"))) int64_t OnnxmluCopyReport(int64_t* values, int64_t count);
}
