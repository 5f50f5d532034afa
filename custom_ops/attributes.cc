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

namespace {

// The body as the 1-D uint8 tensor onnxruntime copied it into, or a BlockError.
OrtPtr<OrtValue> BodyTensor(OrtValue* raw_value, const std::string& prefix) {
  OrtPtr<OrtValue> value(raw_value);
  OrtTensorTypeAndShapeInfo* raw_shape = nullptr;
  Check(Api().GetTensorTypeAndShape(value.get(), &raw_shape), prefix);
  OrtPtr<OrtTensorTypeAndShapeInfo> shape(raw_shape);
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  size_t rank = 0;
  Check(Api().GetTensorElementType(shape.get(), &type), prefix);
  Check(Api().GetDimensionsCount(shape.get(), &rank), prefix);
  if (type != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 || rank != 1) {
    throw BlockError(ORT_INVALID_ARGUMENT, prefix + "attribute 'body' must be a 1-D uint8 tensor holding a serialized ONNX model, got a " +
                                              std::to_string(rank) + "-D " + TypeName(type) + " tensor");
  }
  return value;
}

}  // namespace

std::string_view BodyBytes::bytes() const {
  if (!tensor_) return text_;
  size_t count = 0;
  OrtTensorTypeAndShapeInfo* raw = nullptr;
  void* data = nullptr;
  if (Api().GetTensorTypeAndShape(tensor_.get(), &raw) != nullptr) return {};  // checked by ReadBody
  OrtPtr<OrtTensorTypeAndShapeInfo> shape(raw);
  OrtPtr<OrtStatus> count_error(Api().GetTensorShapeElementCount(shape.get(), &count));
  OrtPtr<OrtStatus> data_error(Api().GetTensorMutableData(tensor_.get(), &data));
  if (count_error || data_error) return {};
  return std::string_view(static_cast<const char*>(data), count);
}

void BodyBytes::Release() {
  tensor_.reset();
  std::string().swap(text_);
}

BodyBytes ReadBody(const OrtKernelInfo* info, const std::string& prefix) {
  BodyBytes body;
  OrtAllocator* allocator = nullptr;
  Check(Api().GetAllocatorWithDefaultOptions(&allocator), prefix);
  OrtValue* raw_value = nullptr;
  OrtStatus* tensor_status = Api().KernelInfoGetAttribute_tensor(info, "body", allocator, &raw_value);
  if (tensor_status == nullptr) {
    body.tensor_ = BodyTensor(raw_value, prefix);
    if (body.bytes().data() == nullptr) throw BlockError(ORT_FAIL, prefix + "cannot read the bytes of attribute 'body'");
    return body;
  }
  OrtPtr<OrtStatus> tensor_error(tensor_status);

  size_t size = 0;
  OrtStatus* string_status = Api().KernelInfoGetAttribute_string(info, "body", nullptr, &size);
  if (string_status == nullptr && size > 0) {
    body.text_.assign(size, '\0');
    Check(Api().KernelInfoGetAttribute_string(info, "body", body.text_.data(), &size), prefix);
    body.text_.resize(size - 1);  // size counts the terminating NUL; the copy itself is binary-safe
    return body;
  }
  if (string_status) Api().ReleaseStatus(string_status);
  throw BlockError(ORT_INVALID_ARGUMENT,
                   prefix + "missing or invalid required attribute 'body' (a uint8 tensor holding the block as a serialized ONNX model): " +
                       Api().GetErrorMessage(tensor_error.get()));
}

namespace {

bool Succeeds(OrtStatus* status) {
  OrtPtr<OrtStatus> owned(status);
  return status == nullptr;
}

// What the node's attribute `name` is, for one that a typed read just refused: absent, or present
// as another type (named for the message). The C API (API 21; onnxruntime through 1.32 too) has
// no call that lists a node's attributes, and its typed reads answer a missing attribute and one
// of another type with the same code (ORT_FAIL); only the message told them apart. So the types
// it reads are probed by return code: one succeeds for an attribute of its type, and the list
// reads (KernelInfoGetAttributeArray_*, asked for the size only) succeed for an attribute of any
// type -- they fail only when the node has no attribute of that name.
struct AttributeType {
  bool present = false;
  const char* name = "";
};

AttributeType TypeOf(const OrtKernelInfo* info, const char* name) {
  int64_t i = 0;
  float f = 0;
  size_t size = 0;
  if (Succeeds(Api().KernelInfoGetAttribute_int64(info, name, &i))) return {true, "an int"};
  if (Succeeds(Api().KernelInfoGetAttribute_float(info, name, &f))) return {true, "a float"};
  if (Succeeds(Api().KernelInfoGetAttribute_string(info, name, nullptr, &size))) return {true, "a string"};
  OrtAllocator* allocator = nullptr;
  OrtValue* tensor = nullptr;
  if (Succeeds(Api().GetAllocatorWithDefaultOptions(&allocator)) &&
      Succeeds(Api().KernelInfoGetAttribute_tensor(info, name, allocator, &tensor))) {
    Api().ReleaseValue(tensor);
    return {true, "a tensor"};
  }
  size_t ints = 0, floats = 0;
  const bool listed = Succeeds(Api().KernelInfoGetAttributeArray_int64(info, name, nullptr, &ints));
  if (listed && ints > 0) return {true, "a list of ints"};
  if (Succeeds(Api().KernelInfoGetAttributeArray_float(info, name, nullptr, &floats)) && floats > 0) {
    return {true, "a list of floats"};
  }
  return {listed, "a graph, a list of strings or tensors, a sparse tensor or an empty list"};
}

// The body's `body_crc32` digest, or nothing when the node has none (files written before the
// attribute existed). Present but not an int in 0..2^32-1: the node is refused.
std::optional<uint32_t> ReadDigest(const OrtKernelInfo* info, const std::string& prefix) {
  int64_t value = 0;
  OrtStatus* status = Api().KernelInfoGetAttribute_int64(info, kDigestAttribute, &value);
  if (!Succeeds(status)) {
    const AttributeType type = TypeOf(info, kDigestAttribute);
    if (!type.present) return std::nullopt;
    throw BlockError(ORT_INVALID_ARGUMENT, prefix + "attribute '" + kDigestAttribute +
                                              "' must be an int (the CRC-32 of the body's bytes), got " + type.name);
  }
  if (value < 0 || value > 0xFFFFFFFFll) {
    throw BlockError(ORT_INVALID_ARGUMENT, prefix + "attribute '" + kDigestAttribute + "' must be between 0 and " +
                                              std::to_string(0xFFFFFFFFll) + " (a CRC-32), got " + std::to_string(value));
  }
  return static_cast<uint32_t>(value);
}

}  // namespace

// The optional `precision` label (docs/precision.md): absent means fp32; present it must name a row
// of kPrecisionLabels (label_rule.h), so that a misspelt or invented label cannot pass for what the
// body computes.
// Returns the label ("fp32" when absent); CheckLabel later holds the body to it.
std::string ReadPrecision(const OrtKernelInfo* info, const std::string& prefix) {
  size_t size = 0;
  OrtStatus* status = Api().KernelInfoGetAttribute_string(info, "precision", nullptr, &size);
  if (!Succeeds(status)) {
    const AttributeType type = TypeOf(info, "precision");
    if (!type.present) return "fp32";
    throw BlockError(ORT_INVALID_ARGUMENT,
                     prefix + "attribute 'precision' must be a string (" + PrecisionLabelNames() + "), got " + type.name);
  }
  std::string value(size, '\0');
  Check(Api().KernelInfoGetAttribute_string(info, "precision", value.data(), &size), prefix);
  value.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
  if (FindPrecisionLabel(value) == nullptr) {
    throw BlockError(ORT_INVALID_ARGUMENT, prefix + "attribute 'precision' must be " + PrecisionLabelNames() + ", got '" +
                                              ValidUtf8(value) + "'");
  }
  return value;
}

// Refuses a body whose bytes changed since the digest was written (a bit flip in a weight would
// otherwise run silently with the wrong weight).
void VerifyDigest(std::string_view body, const OrtKernelInfo* info, const std::string& prefix) {
  const std::optional<uint32_t> expected = ReadDigest(info, prefix);
  if (!expected) return;
  const uint32_t actual = Crc32(body.data(), body.size());
  if (actual != *expected) {
    throw BlockError(ORT_INVALID_GRAPH, prefix + "body is corrupt: its " + Plural(body.size(), "byte") +
                                            " have CRC-32 " + Hex32(actual) + " but attribute '" +
                                            kDigestAttribute + "' says " + Hex32(*expected) +
                                            " (the model file was damaged or the body edited); refusing to run it");
  }
}

void RefuseFileReferences(std::string_view body, const std::string& prefix, const std::vector<std::string>& shared) {
  const FileReferenceScan scan = ScanFileReferences(body, shared);
  if (scan.too_deep) {
    throw BlockError(ORT_INVALID_GRAPH, prefix + "body nests subgraphs more than " + Plural(kMaxScanDepth, "message") +
                                            " deep; refusing to run it");
  }
  if (!scan.found.empty()) {
    throw BlockError(ORT_INVALID_GRAPH, prefix + "body refers to a file (" + scan.found +
                                            "); a block body must hold its weights inline and the library never "
                                            "reads files for it; refusing to run it");
  }
}

void CheckLabel(std::string_view body, const std::string& precision, const std::string& prefix) {
  const std::string mismatch = LabelMismatch(body, precision);
  if (!mismatch.empty()) {
    throw BlockError(ORT_INVALID_GRAPH, prefix + mismatch + "; a block's precision must say what its body computes");
  }
}

SharedWeights ReadSharedWeights(const OrtKernelInfo* info, const std::string& prefix) {
  SharedWeights shared;
  int64_t count = 0;
  if (!Succeeds(Api().KernelInfoGetAttribute_int64(info, kSharedAttribute, &count))) {
    const AttributeType type = TypeOf(info, kSharedAttribute);
    if (!type.present) return shared;  // absent: every weight is in the body
    throw BlockError(ORT_INVALID_GRAPH, prefix + "attribute " + kSharedAttribute +
                                            " must be an int (the count of the node's last inputs that are shared weights), got " +
                                            type.name);
  }
  size_t inputs = 0;
  Check(Api().KernelInfo_GetInputCount(info, &inputs), prefix);
  if (count < 0 || static_cast<size_t>(count) > inputs) {
    throw BlockError(ORT_INVALID_GRAPH, prefix + "attribute " + kSharedAttribute + " = " + std::to_string(count) +
                                            " is not a count of the node's " + Plural(inputs, "input"));
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
