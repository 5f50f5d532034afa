// What every onnxruntime-facing unit of the library shares: the API table, the node-level error
// (BlockError) and its conversion to an OrtStatus, and element type names for messages.
#pragma once

#include <string>
#include <vector>

#include "mlu_fusion_block.h"

namespace onnxmlu {

// A node-level failure; the message is complete ("MLUFusionBlock '<name>': <reason>").
class BlockError : public std::runtime_error {
 public:
  BlockError(OrtErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  OrtErrorCode code() const { return code_; }

 private:
  OrtErrorCode code_;
};

inline const OrtApi& Api() { return Ort::GetApi(); }

// An OrtStatus carrying `prefix` + `detail` with ill-formed UTF-8 escaped (utf8.h), for the
// noexcept functions onnxruntime calls: it never throws, and out of memory it assembles the
// message in a fixed buffer on the stack (cut at kMaxFallbackMessage bytes) instead of the heap.
// (onnxruntime's CreateStatus allocates with nothrow new.)
OrtStatus* ErrorStatus(OrtErrorCode code, const char* prefix, const char* detail) noexcept;
inline constexpr size_t kMaxFallbackMessage = 1024;

// Turns a failed OrtStatus into a BlockError carrying `prefix` + onnxruntime's message.
void Check(OrtStatus* status, const std::string& prefix);

// A count and its noun, as onnxmlu/wording.py's plural(): "1 input", "2 inputs", "0 inputs".
inline std::string Plural(size_t count, const std::string& singular) {
  return std::to_string(count) + " " + singular + (count == 1 ? "" : "s");
}

// Names and bit widths of ONNXTensorElementDataType values (API 21's list); 0 bits: not copyable.
std::string TypeName(ONNXTensorElementDataType type);
size_t ElementBits(ONNXTensorElementDataType type);

// A tensor value's dims and element count, as onnxruntime reports them.
struct ValueShape {
  std::vector<int64_t> dims;
  size_t count = 0;
};
ValueShape ShapeOf(const OrtValue* value, const std::string& prefix);

// What a value looks like on one side of the block boundary.
struct TensorSignature {
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<int64_t> dims;  // -1 for symbolic dimensions
};
// Reads (and releases) a tensor type; `what` describes the value for the error message.
TensorSignature ReadSignature(OrtTypeInfo* raw, const std::string& prefix, const std::string& what);

// A custom metadata entry of a session's model ("" when absent).
std::string ReadBodyMetadata(const OrtSession* session, const char* key, const std::string& prefix);

}  // namespace onnxmlu
