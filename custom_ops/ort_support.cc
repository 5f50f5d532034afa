#include "ort_support.h"

#include "utf8.h"

namespace onnxmlu {

OrtStatus* ErrorStatus(OrtErrorCode code, const char* prefix, const char* detail) noexcept {
  try {
    return Api().CreateStatus(code, ValidUtf8(std::string(prefix) + detail).c_str());
  } catch (...) {  // out of memory (std::bad_alloc): the same message, built without the heap
    char message[kMaxFallbackMessage];
    ValidUtf8Into(message, sizeof(message), prefix, detail);
    return Api().CreateStatus(code, message);
  }
}

void Check(OrtStatus* status, const std::string& prefix) {
  if (status == nullptr) return;
  OrtPtr<OrtStatus> owned(status);
  throw BlockError(Api().GetErrorCode(status), prefix + Api().GetErrorMessage(status));
}

namespace {

struct ElementType {
  const char* name;
  size_t bits;
};
constexpr ElementType kElementTypes[] = {
    {"undefined", 0}, {"float", 32},       {"uint8", 8},           {"int8", 8},         {"uint16", 16},
    {"int16", 16},    {"int32", 32},       {"int64", 64},          {"string", 0},       {"bool", 8},
    {"float16", 16},  {"double", 64},      {"uint32", 32},         {"uint64", 64},      {"complex64", 64},
    {"complex128", 128}, {"bfloat16", 16}, {"float8e4m3fn", 8},    {"float8e4m3fnuz", 8}, {"float8e5m2", 8},
    {"float8e5m2fnuz", 8}, {"uint4", 4},   {"int4", 4},
};
constexpr size_t kElementTypeCount = sizeof(kElementTypes) / sizeof(kElementTypes[0]);

}  // namespace

std::string TypeName(ONNXTensorElementDataType type) {
  auto index = static_cast<size_t>(type);
  if (index < kElementTypeCount) return kElementTypes[index].name;
  return "element type " + std::to_string(index);
}

size_t ElementBits(ONNXTensorElementDataType type) {
  auto index = static_cast<size_t>(type);
  return index < kElementTypeCount ? kElementTypes[index].bits : 0;
}

ValueShape ShapeOf(const OrtValue* value, const std::string& prefix) {
  OrtTensorTypeAndShapeInfo* raw = nullptr;
  Check(Api().GetTensorTypeAndShape(value, &raw), prefix);
  OrtPtr<OrtTensorTypeAndShapeInfo> shape(raw);
  size_t rank = 0;
  ValueShape result;
  Check(Api().GetDimensionsCount(shape.get(), &rank), prefix);
  result.dims.resize(rank);
  if (rank > 0) Check(Api().GetDimensions(shape.get(), result.dims.data(), rank), prefix);
  Check(Api().GetTensorShapeElementCount(shape.get(), &result.count), prefix);
  return result;
}

TensorSignature ReadSignature(OrtTypeInfo* raw, const std::string& prefix, const std::string& what) {
  OrtPtr<OrtTypeInfo> info(raw);
  ONNXType onnx_type = ONNX_TYPE_UNKNOWN;
  Check(Api().GetOnnxTypeFromTypeInfo(info.get(), &onnx_type), prefix);
  if (onnx_type != ONNX_TYPE_TENSOR) {
    throw BlockError(ORT_INVALID_GRAPH, prefix + what + " is not a tensor; only tensors can cross a block boundary");
  }
  const OrtTensorTypeAndShapeInfo* tensor = nullptr;  // owned by `info`
  Check(Api().CastTypeInfoToTensorInfo(info.get(), &tensor), prefix);
  TensorSignature signature;
  Check(Api().GetTensorElementType(tensor, &signature.type), prefix);
  size_t rank = 0;
  Check(Api().GetDimensionsCount(tensor, &rank), prefix);
  signature.dims.resize(rank);
  if (rank > 0) Check(Api().GetDimensions(tensor, signature.dims.data(), rank), prefix);
  return signature;
}

std::string ReadBodyMetadata(const OrtSession* session, const char* key, const std::string& prefix) {
  OrtModelMetadata* raw = nullptr;
  Check(Api().SessionGetModelMetadata(session, &raw), prefix);
  std::unique_ptr<OrtModelMetadata, void (*)(OrtModelMetadata*)> metadata(
      raw, [](OrtModelMetadata* m) { Api().ReleaseModelMetadata(m); });
  OrtAllocator* allocator = nullptr;
  Check(Api().GetAllocatorWithDefaultOptions(&allocator), prefix);
  char* value = nullptr;
  Check(Api().ModelMetadataLookupCustomMetadataMap(metadata.get(), allocator, key, &value), prefix);
  if (value == nullptr) return std::string();
  std::string copy(value);
  Check(Api().AllocatorFree(allocator, value), prefix);
  return copy;
}

}  // namespace onnxmlu
