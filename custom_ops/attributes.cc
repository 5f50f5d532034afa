#include "attributes.h"

#include "body_scan.h"
#include "crc32.h"
#include "label_rule.h"
#include "utf8.h"

namespace onnxmlu {

std::string ReadNodeName(const OrtKernelInfo* info) {
  size_t size = 0;
  OrtStatus* status = Api().KernelInfo_GetNodeName(info, nullptr, &size);
  if (status != nullptr || size == 0) {
    if (status) Api().ReleaseStatus(status);
    return std::string();
  }
  std::string name(size, '\0');
  status = Api().KernelInfo_GetNodeName(info, name.data(), &size);
  if (status != nullptr) {
    Api().ReleaseStatus(status);
    return std::string();
  }
  name.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
  return name;
}

std::string Prefix(const std::string& node_name) {
  return std::string(kOpName) + " '" + (node_name.empty() ? "<unnamed>" : node_name) + "': ";
}

int64_t ReadMp(const OrtKernelInfo* info, const std::string& prefix) {
  int64_t mp = 0;
  OrtStatus* status = Api().KernelInfoGetAttribute_int64(info, "mp", &mp);
  if (status != nullptr) {
    OrtPtr<OrtStatus> owned(status);
    throw BlockError(ORT_INVALID_ARGUMENT, prefix + "missing or invalid required attribute 'mp' (an int, the block's core count >= 1): " +
                                              Api().GetErrorMessage(status));
  }
  if (mp < 1 || mp > kMaxMp) {
    throw BlockError(ORT_INVALID_ARGUMENT, prefix + "attribute 'mp' must be between 1 and " + std::to_string(kMaxMp) +
                                              " (the block's core count), got " + std::to_string(mp));
  }
  return mp;
}

// The serialized body: TENSOR(uint8) (the format onnxmlu writes) or STRING (older files).
std::string ReadBody(const OrtKernelInfo* info, const std::string& prefix) {
  OrtAllocator* allocator = nullptr;
  Check(Api().GetAllocatorWithDefaultOptions(&allocator), prefix);
  OrtValue* raw_value = nullptr;
  OrtStatus* tensor_status = Api().KernelInfoGetAttribute_tensor(info, "body", allocator, &raw_value);
  if (tensor_status == nullptr) {
    OrtPtr<OrtValue> value(raw_value);
    OrtTensorTypeAndShapeInfo* raw_shape = nullptr;
    Check(Api().GetTensorTypeAndShape(value.get(), &raw_shape), prefix);
    OrtPtr<OrtTensorTypeAndShapeInfo> shape(raw_shape);
    ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    size_t rank = 0, count = 0;
    Check(Api().GetTensorElementType(shape.get(), &type), prefix);
    Check(Api().GetDimensionsCount(shape.get(), &rank), prefix);
    Check(Api().GetTensorShapeElementCount(shape.get(), &count), prefix);
    if (type != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 || rank != 1) {
      throw BlockError(ORT_INVALID_ARGUMENT, prefix + "attribute 'body' must be a 1-D uint8 tensor holding a serialized ONNX model, got a " +
                                                std::to_string(rank) + "-D " + TypeName(type) + " tensor");
    }
    void* data = nullptr;
    Check(Api().GetTensorMutableData(value.get(), &data), prefix);
    return std::string(static_cast<const char*>(data), count);
  }
  OrtPtr<OrtStatus> tensor_error(tensor_status);

  size_t size = 0;
  OrtStatus* string_status = Api().KernelInfoGetAttribute_string(info, "body", nullptr, &size);
  if (string_status == nullptr && size > 0) {
    std::string body(size, '\0');
    Check(Api().KernelInfoGetAttribute_string(info, "body", body.data(), &size), prefix);
    body.resize(size - 1);  // size counts the terminating NUL; the copy itself is binary-safe
    return body;
  }
  if (string_status) Api().ReleaseStatus(string_status);
  throw BlockError(ORT_INVALID_ARGUMENT,
                   prefix + "missing or invalid required attribute 'body' (a uint8 tensor holding the block as a serialized ONNX model): " +
                       Api().GetErrorMessage(tensor_error.get()));
}

namespace {

// The body's `body_crc32` digest, or nothing when the node has none (files written before the
// attribute existed). Present but not an int in 0..2^32-1: the node is refused.
std::optional<uint32_t> ReadDigest(const OrtKernelInfo* info, const std::string& prefix) {
  int64_t value = 0;
  OrtStatus* status = Api().KernelInfoGetAttribute_int64(info, kDigestAttribute, &value);
  if (status != nullptr) {
    OrtPtr<OrtStatus> owned(status);
    const std::string message = Api().GetErrorMessage(status);
    // onnxruntime: "No attribute with name:'...'is defined." for an absent one, another
    // message ("Attribute name and type don't match") for one of another type.
    if (message.find("No attribute") != std::string::npos) return std::nullopt;
    throw BlockError(ORT_INVALID_ARGUMENT, prefix + "attribute '" + kDigestAttribute +
                                              "' must be an int (the CRC-32 of the body's bytes): " + message);
  }
  if (value < 0 || value > 0xFFFFFFFFll) {
    throw BlockError(ORT_INVALID_ARGUMENT, prefix + "attribute '" + kDigestAttribute + "' must be between 0 and " +
                                              std::to_string(0xFFFFFFFFll) + " (a CRC-32), got " + std::to_string(value));
  }
  return static_cast<uint32_t>(value);
}

}  // namespace

// The optional `precision` label (docs/precision.md): absent means fp32; present it must be one of
// fp32, fp16, int8, so that a misspelt or invented label cannot pass for what the body computes.
// Returns the label ("fp32" when absent); CheckLabel later holds the body to it.
std::string ReadPrecision(const OrtKernelInfo* info, const std::string& prefix) {
  size_t size = 0;
  OrtStatus* status = Api().KernelInfoGetAttribute_string(info, "precision", nullptr, &size);
  if (status != nullptr) {
    OrtPtr<OrtStatus> owned(status);
    if (std::string(Api().GetErrorMessage(status)).find("No attribute") != std::string::npos) return "fp32";
    throw BlockError(ORT_INVALID_ARGUMENT, prefix + "attribute 'precision' must be a string (fp32, fp16 or int8): " +
                                              Api().GetErrorMessage(status));
  }
  std::string value(size, '\0');
  Check(Api().KernelInfoGetAttribute_string(info, "precision", value.data(), &size), prefix);
  value.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
  if (value != "fp32" && value != "fp16" && value != "int8") {
    throw BlockError(ORT_INVALID_ARGUMENT, prefix + "attribute 'precision' must be fp32, fp16 or int8, got '" +
                                              ValidUtf8(value) + "'");
  }
  return value;
}

// Refuses a body whose bytes changed since the digest was written (a bit flip in a weight would
// otherwise run silently with the wrong weight).
void VerifyDigest(const std::string& body, const OrtKernelInfo* info, const std::string& prefix) {
  const std::optional<uint32_t> expected = ReadDigest(info, prefix);
  if (!expected) return;
  const uint32_t actual = Crc32(body.data(), body.size());
  if (actual != *expected) {
    throw BlockError(ORT_INVALID_GRAPH, prefix + "body is corrupt: its " + std::to_string(body.size()) +
                                            " bytes have CRC-32 " + Hex32(actual) + " but attribute '" +
                                            kDigestAttribute + "' says " + Hex32(*expected) +
                                            " (the model file was damaged or the body edited); refusing to run it");
  }
}


void RefuseFileReferences(const std::string& body, const std::string& prefix, const std::vector<std::string>& shared) {
  const FileReferenceScan scan = ScanFileReferences(body, shared);
  if (scan.too_deep) {
    throw BlockError(ORT_INVALID_GRAPH, prefix + "body nests subgraphs more than " + std::to_string(kMaxScanDepth) +
                                            " messages deep; refusing to run it");
  }
  if (!scan.found.empty()) {
    throw BlockError(ORT_INVALID_GRAPH, prefix + "body refers to a file (" + scan.found +
                                            "); a block body must hold its weights inline and the library never "
                                            "reads files for it; refusing to run it");
  }
}

void CheckLabel(const std::string& body, const std::string& precision, const std::string& prefix) {
  const std::string mismatch = LabelMismatch(body, precision);
  if (!mismatch.empty()) {
    throw BlockError(ORT_INVALID_GRAPH, prefix + mismatch + "; a block's precision must say what its body computes");
  }
}

SharedWeights ReadSharedWeights(const OrtKernelInfo* info, const std::string& prefix) {
  SharedWeights shared;
  int64_t count = 0;
  OrtStatus* status = Api().KernelInfoGetAttribute_int64(info, kSharedAttribute, &count);
  if (status != nullptr) {  // absent: every weight is in the body
    Api().ReleaseStatus(status);
    return shared;
  }
  size_t inputs = 0;
  Check(Api().KernelInfo_GetInputCount(info, &inputs), prefix);
  if (count < 0 || static_cast<size_t>(count) > inputs) {
    throw BlockError(ORT_INVALID_GRAPH, prefix + "attribute " + kSharedAttribute + " = " + std::to_string(count) +
                                            " is not a count of the node's " + std::to_string(inputs) + " inputs");
  }
  for (size_t i = inputs - static_cast<size_t>(count); i < inputs; ++i) {
    size_t size = 0;
    Check(Api().KernelInfo_GetInputName(info, i, nullptr, &size), prefix);
    std::string name(size, '\0');
    Check(Api().KernelInfo_GetInputName(info, i, name.data(), &size), prefix);
    name.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
    int is_constant = 0;
    const OrtValue* value = nullptr;
    Check(Api().KernelInfoGetConstantInput_tensor(info, i, &is_constant, &value), prefix);
    if (!is_constant || value == nullptr) {
      throw BlockError(ORT_INVALID_GRAPH, prefix + "input " + std::to_string(i) + " ('" + name +
                                              "') is a shared weight but not a constant initializer of the graph");
    }
    shared.names.push_back(std::move(name));
    shared.values.push_back(value);
  }
  return shared;
}

}  // namespace onnxmlu
