// The MLUFusionBlock kernel: an inner session built from the body (see mlu_fusion_block.h for
// the contract), and Compute, which hands the node's inputs to it and its outputs back.
#include "mlu_fusion_block.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <utility>

#include "attributes.h"
#include "inner_session.h"
#include "ort_support.h"

namespace onnxmlu {

namespace {

// OnnxmluCopyReport's counters (indices as documented in the header).
std::array<std::atomic<int64_t>, 3> g_copy_report{};
enum CopyIndex { kCopiedOutputs, kInPlaceDynamic, kDimsRefusals };

// Whether onnxruntime may hand a block float where its body has float16/bfloat16 (see
// FusionBlockKernel::narrow_to_): the block converts, exactly as the Cast it dropped would.
bool IsWidening(ONNXTensorElementDataType body, ONNXTensorElementDataType node) {
  return node == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT &&
         (body == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 || body == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16);
}

}  // namespace

void FusionBlockKernel::PoolUse::Count(int threads, bool on_global_pool) {
  global = on_global_pool;
  // onnxruntime creates threads - 1 workers (the caller is the first thread); 0 threads means
  // its default, one per physical core, counted here as the hardware threads (an upper bound).
  own_workers = global ? 0 : static_cast<int>((threads > 0 ? threads : HardwareThreads()) - 1);
  if (global) {
    g_thread_report[kGlobalSessions].fetch_add(1, std::memory_order_relaxed);
  } else if (own_workers > 0) {
    g_thread_report[kOwnPools].fetch_add(1, std::memory_order_relaxed);
    g_thread_report[kOwnWorkers].fetch_add(own_workers, std::memory_order_relaxed);
  }
}

FusionBlockKernel::PoolUse::~PoolUse() {
  if (global) {
    g_thread_report[kGlobalSessions].fetch_sub(1, std::memory_order_relaxed);
  } else if (own_workers > 0) {
    g_thread_report[kOwnPools].fetch_sub(1, std::memory_order_relaxed);
    g_thread_report[kOwnWorkers].fetch_sub(own_workers, std::memory_order_relaxed);
  }
}

FusionBlockKernel::FusionBlockKernel(const OrtKernelInfo* info, const InnerConfig& config)
    : node_name_(ReadNodeName(info)), prefix_(Prefix(node_name_)) {
  const std::string& prefix = prefix_;
  mp_ = ReadMp(info, prefix);
  const std::string precision = ReadPrecision(info, prefix);
  BodyBytes body_bytes = ReadBody(info, prefix);
  const std::string_view body = body_bytes.bytes();  // read in place from here on (no copy)
  VerifyDigest(body, info, prefix);
  const SharedWeights shared = ReadSharedWeights(info, prefix);
  RefuseFileReferences(body, prefix, shared.names);

  OrtEnv* env = nullptr;  // CreateEnv hands back the process's existing env (ref-counted)
  Check(Api().CreateEnv(ORT_LOGGING_LEVEL_WARNING, "onnxmlu", &env), prefix);
  env_.reset(env);
  ShareCpuArena(env_.get());

  const int threads = InnerThreads(mp_, config, prefix);
  bool on_global_pool = false;
  OrtSession* session = nullptr;
  const SharedViews views = ViewsOf(shared, prefix);
  OrtStatus* status = CreateInnerSession(env_.get(), body, threads, config, node_name_, prefix, views, &session,
                                         &on_global_pool, /*exact_int8=*/true);
  if (status != nullptr && IsExactInt8Failure(Api().GetErrorMessage(status))) {
    WarnExactInt8Retry(info, node_name_, Api().GetErrorMessage(status));
    Api().ReleaseStatus(status);  // see kExactInt8Failures: retry with onnxruntime's default kernels
    status = CreateInnerSession(env_.get(), body, threads, config, node_name_, prefix, views, &session,
                                &on_global_pool, /*exact_int8=*/false);
  }
  if (status != nullptr) {
    OrtPtr<OrtStatus> owned(status);
    std::string message = Api().GetErrorMessage(status);
    if (message.find(kNestedMessage) != std::string::npos) {
      throw BlockError(ORT_INVALID_GRAPH, prefix + "body contains an MLUFusionBlock node; " + kNestedMessage + " (" + message + ")");
    }
    throw BlockError(ORT_INVALID_GRAPH, prefix + "body is not a valid ONNX model: " + message);
  }
  session_.reset(session);
  pool_use_.Count(threads, on_global_pool);
  CheckLabel(body, precision, prefix);  // after onnxruntime parsed it: the bytes are a well-formed model
  body_bytes.Release();  // the inner session holds what it needs: free the copy now

  size_t node_inputs = 0, node_outputs = 0, body_inputs = 0, body_outputs = 0;
  Check(Api().KernelInfo_GetInputCount(info, &node_inputs), prefix);
  Check(Api().KernelInfo_GetOutputCount(info, &node_outputs), prefix);
  Check(Api().SessionGetInputCount(session_.get(), &body_inputs), prefix);
  Check(Api().SessionGetOutputCount(session_.get(), &body_outputs), prefix);
  node_inputs -= shared.names.size();  // the shared weights are the body's initializers, not its inputs
  if (body_inputs != node_inputs) {
    throw BlockError(ORT_INVALID_GRAPH, prefix + "body has " + Plural(body_inputs, "input") + " but the node has " +
                                            std::to_string(node_inputs) + " (besides its shared weights)");
  }
  if (body_outputs != node_outputs) {
    throw BlockError(ORT_INVALID_GRAPH, prefix + "body has " + Plural(body_outputs, "output") + " but the node has " +
                                            std::to_string(node_outputs));
  }

  OrtAllocator* allocator = nullptr;
  Check(Api().GetAllocatorWithDefaultOptions(&allocator), prefix);
  auto take_name = [&](char* name) {
    std::string copy(name);
    Check(Api().AllocatorFree(allocator, name), prefix);
    return copy;
  };

  for (size_t i = 0; i < body_inputs; ++i) {
    char* name = nullptr;
    Check(Api().SessionGetInputName(session_.get(), i, allocator, &name), prefix);
    input_names_.push_back(take_name(name));
    std::string what = "input " + std::to_string(i) + " ('" + input_names_.back() + "')";
    OrtTypeInfo* raw = nullptr;
    Check(Api().SessionGetInputTypeInfo(session_.get(), i, &raw), prefix);
    TensorSignature inner = ReadSignature(raw, prefix, "body " + what);
    Check(Api().KernelInfo_GetInputTypeInfo(info, i, &raw),
          prefix + "cannot read the type of the node's input " + std::to_string(i) + ": ");
    TensorSignature outer = ReadSignature(raw, prefix, "node " + what);
    if (inner.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING || outer.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING) {
      throw BlockError(ORT_INVALID_GRAPH, prefix + "body " + what + " is a string tensor; string tensors cannot cross a block boundary");
    }
    narrow_to_.push_back(ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED);
    if (IsWidening(inner.type, outer.type)) {
      narrow_to_.back() = inner.type;  // the Cast onnxruntime removed is done in Compute
    } else if (inner.type != outer.type) {
      throw BlockError(ORT_INVALID_GRAPH, prefix + "body " + what + " is " + TypeName(inner.type) + " but the node's input " +
                                              std::to_string(i) + " is " + TypeName(outer.type));
    }
  }

  for (size_t i = 0; i < body_outputs; ++i) {
    char* name = nullptr;
    Check(Api().SessionGetOutputName(session_.get(), i, allocator, &name), prefix);
    output_names_.push_back(take_name(name));
    std::string what = "output " + std::to_string(i) + " ('" + output_names_.back() + "')";
    OrtTypeInfo* raw = nullptr;
    Check(Api().SessionGetOutputTypeInfo(session_.get(), i, &raw), prefix);
    TensorSignature inner = ReadSignature(raw, prefix, "body " + what);
    Check(Api().KernelInfo_GetOutputTypeInfo(info, i, &raw),
          prefix + "cannot read the type of the node's output " + std::to_string(i) +
              " (the outer graph must carry value_info for every block output): ");
    TensorSignature outer = ReadSignature(raw, prefix, "node " + what);
    if (inner.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING || outer.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING) {
      throw BlockError(ORT_INVALID_GRAPH, prefix + "body " + what + " is a string tensor; string tensors cannot cross a block boundary");
    }
    OutputPlan plan;
    plan.element_bits = ElementBits(inner.type);
    if (IsWidening(inner.type, outer.type)) {
      plan.widen_from = inner.type;  // the Cast onnxruntime removed is done after the run
    } else if (inner.type != outer.type) {
      throw BlockError(ORT_INVALID_GRAPH, prefix + "body " + what + " is " + TypeName(inner.type) + " but the node's output " +
                                              std::to_string(i) + " is " + TypeName(outer.type) +
                                              " (check the outer graph's value_info)");
    }
    // A rank-0 output has empty dims and is static too; zero or unknown dims take the copy path,
    // and so does an output widened to float.
    plan.is_static = plan.widen_from == ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED && std::all_of(inner.dims.begin(), inner.dims.end(), [](int64_t d) { return d > 0; });
    if (plan.is_static) {
      plan.dims = inner.dims;
    } else if (plan.element_bits == 0) {
      throw BlockError(ORT_NOT_IMPLEMENTED, prefix + "body " + what + " has a dynamic shape and element type " +
                                                TypeName(inner.type) + ", which this library cannot copy");
    }
    outputs_.push_back(std::move(plan));
  }

  for (const auto& name : input_names_) input_name_ptrs_.push_back(name.c_str());
  PlanOutputSources(prefix);
  bool dynamic = std::any_of(outputs_.begin(), outputs_.end(), [](const OutputPlan& o) { return !o.is_static; });
  learn_shapes_ = dynamic && ReadBodyMetadata(session_.get(), kOutputShapesKey, prefix) == kFollowInputShapes;
  const std::string dims = dynamic ? ReadBodyMetadata(session_.get(), kOutputDimsKey, prefix) : std::string();
  // Advisory: malformed or mismatched metadata (a foreign writer) leaves the copy path, as without it.
  if (!dims.empty()) output_dims_ = ParseOutputDims(dims, outputs_.size(), input_names_.size()).value_or(output_dims_);
}

std::optional<FusionBlockKernel::Shapes> FusionBlockKernel::LearnedShapes(const std::vector<int64_t>& key) const {
  std::lock_guard<std::mutex> lock(learned_mutex_);
  auto found = learned_.find(key);
  if (found == learned_.end()) return std::nullopt;
  return found->second;
}

void FusionBlockKernel::Learn(std::vector<int64_t> key, Shapes shapes) const {
  std::lock_guard<std::mutex> lock(learned_mutex_);
  if (learned_.size() < kMaxLearnedShapes) learned_.emplace(std::move(key), std::move(shapes));
}

namespace {

// The input shapes of one run as a map key: per input its rank, then its dims.
std::vector<int64_t> InputShapeKey(const std::vector<const OrtValue*>& inputs, const std::string& prefix) {
  std::vector<int64_t> key;
  for (const OrtValue* value : inputs) {
    const std::vector<int64_t> dims = ShapeOf(value, prefix).dims;
    key.push_back(static_cast<int64_t>(dims.size()));
    key.insert(key.end(), dims.begin(), dims.end());
  }
  return key;
}

}  // namespace

OrtStatusPtr FusionBlockKernel::ComputeV2(OrtKernelContext* context) const noexcept {
  try {
    Compute(context);
    return nullptr;
  } catch (const BlockError& error) {
    return ErrorStatus(error.code(), "", error.what());
  } catch (const std::exception& error) {  // std::bad_alloc among them: nothing here allocates
    return ErrorStatus(ORT_FAIL, prefix_.c_str(), error.what());
  } catch (...) {
    return ErrorStatus(ORT_FAIL, prefix_.c_str(), "unknown error while running the block");
  }
}

void FusionBlockKernel::Compute(OrtKernelContext* context) const {
  const size_t n_inputs = input_names_.size(), n_outputs = output_names_.size();
  std::vector<const OrtValue*> inputs(n_inputs, nullptr);
  for (size_t i = 0; i < n_inputs; ++i) {
    if (OrtStatus* s = Api().KernelContext_GetInput(context, i, &inputs[i])) Check(s, BlockName());
  }
  std::vector<OrtPtr<OrtValue>> narrowed(n_inputs);
  for (size_t i = 0; i < n_inputs; ++i) {
    if (narrow_to_[i] == ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED) continue;
    narrowed[i] = Narrow(inputs[i], narrow_to_[i]);
    inputs[i] = narrowed[i].get();
  }
  // Static outputs, dynamic ones whose shapes a run at these input shapes taught us, and those
  // the dims metadata gives at these input shapes: the inner session writes into the node's own
  // output buffers (no copy).
  std::vector<int64_t> key;
  std::optional<Shapes> learned;
  if (learn_shapes_) {
    key = InputShapeKey(inputs, BlockName());
    learned = LearnedShapes(key);
  }
  const MaybeShapes expressed = ExpressedShapes(inputs);
  // The inner Run computes each distinct output that is not an input (OutputPlan::source);
  // results[r] is the value of run output r: the node's own buffer when written in place.
  std::vector<bool> in_place(n_outputs, false);
  bool from_dims = false;
  std::vector<OrtValue*> results = AllocateInPlace(context, learned, expressed, &in_place, &from_dims);
  std::vector<OrtPtr<OrtValue>> owned = Run(inputs, results, in_place, from_dims);
  Shapes seen(n_outputs);
  for (size_t i = 0; i < n_outputs; ++i) {
    const OutputPlan& plan = outputs_[i];
    if (plan.source == OutputPlan::Source::kInput) {
      seen[i] = CopyDynamicOutput(context, i, inputs[plan.source_index]);
    } else if (plan.source == OutputPlan::Source::kOutput) {
      seen[i] = CopyDynamicOutput(context, i, results[outputs_[plan.source_index].run_index]);
    } else if (!in_place[i]) {
      seen[i] = CopyDynamicOutput(context, i, owned[plan.run_index].get());
      g_copy_report[kCopiedOutputs].fetch_add(1, std::memory_order_relaxed);
    } else if (!plan.is_static) {
      seen[i] = ShapeOf(results[plan.run_index], BlockName()).dims;
      g_copy_report[kInPlaceDynamic].fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (dims_state_.load(std::memory_order_acquire) == kDimsUnchecked) CheckExpressedShapes(expressed, seen);
  if (learn_shapes_ && !learned) Learn(std::move(key), std::move(seen));
}

std::vector<OrtValue*> FusionBlockKernel::AllocateInPlace(OrtKernelContext* context, const std::optional<Shapes>& learned,
                                                          const MaybeShapes& expressed, std::vector<bool>* in_place,
                                                          bool* from_dims) const {
  std::vector<OrtValue*> results(run_output_ptrs_.size(), nullptr);
  const bool trusted = dims_state_.load(std::memory_order_acquire) == kDimsTrusted;
  for (size_t i = 0; i < outputs_.size(); ++i) {
    const OutputPlan& plan = outputs_[i];
    if (plan.source != OutputPlan::Source::kRun) continue;
    const bool exact_type = plan.widen_from == ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  // else converted after
    const std::vector<int64_t>* dims = nullptr;
    if (plan.is_static) {
      dims = &plan.dims;
    } else if (exact_type && trusted && expressed[i]) {
      dims = &*expressed[i];
      *from_dims = true;
    } else if (exact_type && learned) {
      dims = &(*learned)[i];
    }
    if (dims == nullptr) continue;
    if (OrtStatus* s = Api().KernelContext_GetOutput(context, i, dims->data(), dims->size(), &results[plan.run_index])) {
      Check(s, BlockName());
    }
    (*in_place)[i] = true;
  }
  return results;
}

FusionBlockKernel::MaybeShapes FusionBlockKernel::ExpressedShapes(const std::vector<const OrtValue*>& inputs) const {
  MaybeShapes shapes(outputs_.size());
  if (output_dims_.empty() || dims_state_.load(std::memory_order_acquire) == kDimsRefused) return shapes;
  Shapes input_shapes;
  for (const OrtValue* value : inputs) input_shapes.push_back(ShapeOf(value, BlockName()).dims);
  for (size_t i = 0; i < outputs_.size(); ++i) {
    if (outputs_[i].is_static || !output_dims_[i]) continue;
    std::vector<int64_t> dims;
    for (const DimPolynomial& dim : *output_dims_[i]) {
      const std::optional<int64_t> value = EvaluateDim(dim, input_shapes);
      if (!value) break;
      dims.push_back(*value);
    }
    if (dims.size() == output_dims_[i]->size()) shapes[i] = std::move(dims);
  }
  return shapes;
}

void FusionBlockKernel::CheckExpressedShapes(const MaybeShapes& expressed, const Shapes& seen) const {
  if (output_dims_.empty()) return;
  bool agree = true;
  for (size_t i = 0; i < outputs_.size(); ++i) {
    if (outputs_[i].source == OutputPlan::Source::kRun && expressed[i] && *expressed[i] != seen[i]) agree = false;
  }
  int unchecked = kDimsUnchecked;
  if (dims_state_.compare_exchange_strong(unchecked, agree ? kDimsTrusted : kDimsRefused) && !agree) {
    g_copy_report[kDimsRefusals].fetch_add(1, std::memory_order_relaxed);
  }
}

// The inner Run over `results` (preallocated where `in_place`); returns the results it allocated,
// ours to release whatever happens next. A body whose outputs are all inputs needs no Run.
std::vector<OrtPtr<OrtValue>> FusionBlockKernel::Run(const std::vector<const OrtValue*>& inputs,
                                                     std::vector<OrtValue*>& results,
                                                     const std::vector<bool>& in_place, bool from_dims) const {
  std::vector<OrtPtr<OrtValue>> owned(results.size());
  if (results.empty()) return owned;
  if (pool_use_.global || pool_use_.own_workers > 0) {
    g_thread_report[pool_use_.global ? kGlobalRuns : kOwnPoolRuns].fetch_add(1, std::memory_order_relaxed);
  }
  OrtStatus* status = Api().Run(session_.get(), nullptr, input_name_ptrs_.data(), inputs.data(), inputs.size(),
                                run_output_ptrs_.data(), results.size(), results.data());
  for (size_t i = 0; i < outputs_.size(); ++i) {
    if (outputs_[i].source == OutputPlan::Source::kRun && !in_place[i]) owned[outputs_[i].run_index].reset(results[outputs_[i].run_index]);
  }
  if (status != nullptr && from_dims) {
    // A wrong dims metadata (the first run agreed with it, this one not): onnxruntime refuses a
    // preallocated output of another shape, and the node's outputs are already allocated at
    // that shape, so this run fails (never wrong data); every later run copies.
    if (dims_state_.exchange(kDimsRefused) != kDimsRefused) g_copy_report[kDimsRefusals].fetch_add(1);
    Check(status, BlockName() + "outputs allocated at the shapes its output dims metadata gives were refused "
                                "(later runs let the inner session allocate them): ");
  }
  if (status != nullptr) Check(status, BlockName());
  return owned;
}

// Where each output's value comes from (OutputPlan::source). onnxruntime's Run fills only one of
// two requested outputs of the same name, and leaves a preallocated output that is a graph input
// unwritten: such outputs are copied from their input or first occurrence after the Run instead.
void FusionBlockKernel::PlanOutputSources(const std::string& prefix) {
  for (size_t i = 0; i < outputs_.size(); ++i) {
    OutputPlan& plan = outputs_[i];
    const std::string& name = output_names_[i];
    const auto input = std::find(input_names_.begin(), input_names_.end(), name);
    const auto earlier = std::find(output_names_.begin(), output_names_.begin() + i, name);
    if (input == input_names_.end() && earlier == output_names_.begin() + i) {
      plan.run_index = run_output_ptrs_.size();
      run_output_ptrs_.push_back(name.c_str());
      continue;
    }
    plan.source = input != input_names_.end() ? OutputPlan::Source::kInput : OutputPlan::Source::kOutput;
    plan.source_index = input != input_names_.end() ? input - input_names_.begin() : earlier - output_names_.begin();
    plan.is_static = false;  // copied after the Run
    if (plan.element_bits == 0) {
      throw BlockError(ORT_NOT_IMPLEMENTED, prefix + "body output " + std::to_string(i) + " ('" + name +
                                                "') repeats an input or output of an element type this library cannot copy");
    }
  }
}

// A float tensor rounded to float16 or bfloat16 (to nearest even, as onnxruntime's Cast does).
OrtPtr<OrtValue> FusionBlockKernel::Narrow(const OrtValue* value, ONNXTensorElementDataType type) const {
  const std::string& prefix = BlockName();
  const auto [dims, count] = ShapeOf(value, prefix);
  OrtAllocator* allocator = nullptr;
  Check(Api().GetAllocatorWithDefaultOptions(&allocator), prefix);
  OrtValue* raw = nullptr;
  Check(Api().CreateTensorAsOrtValue(allocator, dims.data(), dims.size(), type, &raw), prefix);
  OrtPtr<OrtValue> result(raw);
  void* source = nullptr;
  void* target = nullptr;
  Check(Api().GetTensorMutableData(const_cast<OrtValue*>(value), &source), prefix);
  Check(Api().GetTensorMutableData(result.get(), &target), prefix);
  const auto* from = static_cast<const float*>(source);
  auto* to = static_cast<uint16_t*>(target);
  for (size_t k = 0; k < count; ++k) {
    to[k] = type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ? Ort::Float16_t(from[k]).val : Ort::BFloat16_t(from[k]).val;
  }
  return result;
}

std::vector<int64_t> FusionBlockKernel::CopyDynamicOutput(OrtKernelContext* context, size_t index,
                                                          const OrtValue* result) const {
  const std::string& prefix = BlockName();
  if (result == nullptr) {
    throw BlockError(ORT_FAIL, prefix + "inner session returned no value for output " + std::to_string(index));
  }
  const auto [dims, count] = ShapeOf(result, prefix);

  OrtValue* output = nullptr;  // owned by onnxruntime
  Check(Api().KernelContext_GetOutput(context, index, dims.data(), dims.size(), &output), prefix);
  const size_t bytes = (count * outputs_[index].element_bits + 7) / 8;
  if (bytes == 0) return dims;
  void* source = nullptr;
  void* target = nullptr;
  // GetTensorMutableData only reads the pointer; the inner result is not modified.
  Check(Api().GetTensorMutableData(const_cast<OrtValue*>(result), &source), prefix);
  Check(Api().GetTensorMutableData(output, &target), prefix);
  const ONNXTensorElementDataType widen = outputs_[index].widen_from;
  if (widen == ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED) {
    std::memcpy(target, source, bytes);
    return dims;
  }
  const auto* from = static_cast<const uint16_t*>(source);
  auto* to = static_cast<float*>(target);
  for (size_t k = 0; k < count; ++k) {  // exact: every 16-bit float is a float
    to[k] = widen == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ? Ort::Float16_t::FromBits(from[k]).ToFloat()
                                                           : Ort::BFloat16_t::FromBits(from[k]).ToFloat();
  }
  return dims;
}

}  // namespace onnxmlu

extern "C" int64_t OnnxmluCopyReport(int64_t* values, int64_t count) {
  const auto& report = onnxmlu::g_copy_report;
  for (int64_t i = 0; values != nullptr && i < count && i < static_cast<int64_t>(report.size()); ++i) {
    values[i] = report[i].load(std::memory_order_relaxed);
  }
  return static_cast<int64_t>(report.size());
}
