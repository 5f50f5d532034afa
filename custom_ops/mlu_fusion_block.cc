// Implementation of the MLUFusionBlock custom op; see mlu_fusion_block.h for the contract.
#include "mlu_fusion_block.h"

#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <new>
#include <optional>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <utility>

namespace onnxmlu {

namespace {

// CRC-32 by "slicing by 16": sixteen 256-entry tables, 16 input bytes per step (about 1 cycle
// per 2 bytes, no CPU-specific instructions). kCrcTables[0] is the classic byte-at-a-time table;
// kCrcTables[k][b] is the CRC of byte b followed by k zero bytes.
using CrcTables = std::array<std::array<uint32_t, 256>, 16>;

constexpr CrcTables MakeCrcTables() {
  CrcTables tables{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    tables[0][b] = c;
  }
  for (size_t k = 1; k < tables.size(); ++k) {
    for (uint32_t b = 0; b < 256; ++b) tables[k][b] = (tables[k - 1][b] >> 8) ^ tables[0][tables[k - 1][b] & 0xFF];
  }
  return tables;
}

constexpr CrcTables kCrcTables = MakeCrcTables();

inline uint32_t LoadLittle32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;  // compilers turn this into one load on little-endian CPUs
}

}  // namespace

uint32_t Crc32(const void* data, size_t size, uint32_t crc) noexcept {
  const auto& t = kCrcTables;
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (; size >= 16; size -= 16, p += 16) {
    const uint32_t a = LoadLittle32(p) ^ c, b = LoadLittle32(p + 4), d = LoadLittle32(p + 8), e = LoadLittle32(p + 12);
    c = t[15][a & 0xFF] ^ t[14][(a >> 8) & 0xFF] ^ t[13][(a >> 16) & 0xFF] ^ t[12][a >> 24] ^
        t[11][b & 0xFF] ^ t[10][(b >> 8) & 0xFF] ^ t[9][(b >> 16) & 0xFF] ^ t[8][b >> 24] ^
        t[7][d & 0xFF] ^ t[6][(d >> 8) & 0xFF] ^ t[5][(d >> 16) & 0xFF] ^ t[4][d >> 24] ^
        t[3][e & 0xFF] ^ t[2][(e >> 8) & 0xFF] ^ t[1][(e >> 16) & 0xFF] ^ t[0][e >> 24];
  }
  for (; size > 0; --size, ++p) c = t[0][(c ^ *p) & 0xFF] ^ (c >> 8);
  return ~c;
}

namespace {

// A node-level failure; the message is complete ("MLUFusionBlock '<name>': <reason>").
class BlockError : public std::runtime_error {
 public:
  BlockError(OrtErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  OrtErrorCode code() const { return code_; }

 private:
  OrtErrorCode code_;
};

const OrtApi& Api() { return Ort::GetApi(); }

// Length of the well-formed UTF-8 sequence at text[i] (Unicode Table 3-7), 0 when ill-formed.
size_t Utf8SequenceLength(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the first continuation byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // no overlong forms
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (size_t k = 2; k < length; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return length;
}

// Messages quote names from the model, and a corrupt body has arbitrary bytes in its names;
// Python decodes status messages as UTF-8 and would raise UnicodeDecodeError instead of
// showing the message. Ill-formed bytes become \xNN.
std::string ValidUtf8(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (size_t length = Utf8SequenceLength(text, i)) {
      out.append(text, i, length);
      i += length;
      continue;
    }
    static const char kHex[] = "0123456789abcdef";
    const auto value = static_cast<unsigned char>(text[i++]);
    out += "\\x";
    out += kHex[value >> 4];
    out += kHex[value & 0xF];
  }
  return out;
}

OrtStatus* MakeStatus(OrtErrorCode code, const std::string& message) noexcept {
  try {
    return Api().CreateStatus(code, ValidUtf8(message).c_str());
  } catch (...) {  // out of memory while escaping: the raw message is better than none
    return Api().CreateStatus(code, message.c_str());
  }
}

// Turns a failed OrtStatus into a BlockError carrying `prefix` + onnxruntime's message.
void Check(OrtStatus* status, const std::string& prefix) {
  if (status == nullptr) return;
  OrtPtr<OrtStatus> owned(status);
  throw BlockError(Api().GetErrorCode(status), prefix + Api().GetErrorMessage(status));
}

// Names and bit widths indexed by ONNXTensorElementDataType (API 21's list).
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

std::string TypeName(ONNXTensorElementDataType type) {
  auto index = static_cast<size_t>(type);
  if (index < kElementTypeCount) return kElementTypes[index].name;
  return "element type " + std::to_string(index);
}

size_t ElementBits(ONNXTensorElementDataType type) {
  auto index = static_cast<size_t>(type);
  return index < kElementTypeCount ? kElementTypes[index].bits : 0;
}

// What a value looks like on one side of the block boundary.
struct TensorSignature {
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<int64_t> dims;  // -1 for symbolic dimensions
};

// Reads a tensor type; `what` describes the value for the error message.
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

// A tensor value's dims and element count, as onnxruntime reports them.
struct ValueShape {
  std::vector<int64_t> dims;
  size_t count = 0;
};

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

// A custom metadata entry of the body ("" when absent).
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

// Whether onnxruntime may hand a block float where its body has float16/bfloat16 (see
// FusionBlockKernel::narrow_to_): the block converts, exactly as the Cast it dropped would.
bool IsWidening(ONNXTensorElementDataType body, ONNXTensorElementDataType node) {
  return node == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT &&
         (body == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 || body == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16);
}

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

std::string Hex32(uint32_t value) {
  static const char kHex[] = "0123456789abcdef";
  std::string text = "0x00000000";
  for (int i = 9; i >= 2; --i, value >>= 4) text[i] = kHex[value & 0xF];
  return text;
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

// --- file references -------------------------------------------------------------------------
// A body must hold its weights inline. A tensor with external data names a file that the inner
// session (made from bytes, with no model path) would resolve against the process's working
// directory, not the model's folder: a downloaded model could read ./secret.txt into its output.
// The body is scanned in protobuf's wire format, descending only into the messages that can hold
// a tensor (onnx.proto field numbers), before onnxruntime parses it.
enum class Message { kModel, kGraph, kFunction, kNode, kAttribute, kSparseTensor, kTensor, kEntry };

// The message type of field `field` of a `parent`, when it is one that can lead to a tensor.
std::optional<Message> ChildMessage(Message parent, uint64_t field) {
  switch (parent) {
    case Message::kModel:  // graph, functions
      return field == 7 ? std::optional(Message::kGraph) : field == 25 ? std::optional(Message::kFunction) : std::nullopt;
    case Message::kGraph:  // node, initializer, sparse_initializer
      if (field == 1) return Message::kNode;
      if (field == 5) return Message::kTensor;
      return field == 15 ? std::optional(Message::kSparseTensor) : std::nullopt;
    case Message::kFunction:  // node
      return field == 7 ? std::optional(Message::kNode) : std::nullopt;
    case Message::kNode:  // attribute
      return field == 5 ? std::optional(Message::kAttribute) : std::nullopt;
    case Message::kAttribute:  // t, g, tensors, graphs, sparse_tensor, sparse_tensors
      if (field == 5 || field == 10) return Message::kTensor;
      if (field == 6 || field == 11) return Message::kGraph;
      return field == 22 || field == 23 ? std::optional(Message::kSparseTensor) : std::nullopt;
    case Message::kSparseTensor:  // values, indices
      return field == 1 || field == 2 ? std::optional(Message::kTensor) : std::nullopt;
    case Message::kTensor:  // external_data (13) is read by WireScanner itself
    case Message::kEntry:
      return std::nullopt;
  }
  return std::nullopt;
}

// Reads one protobuf varint at `p` (advanced past it); false when it runs past `end`.
bool ReadVarint(const char*& p, const char* end, uint64_t& value) {
  value = 0;
  for (int shift = 0; shift < 64 && p < end; shift += 7) {
    const auto byte = static_cast<unsigned char>(*p++);
    value |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

class WireScanner {
 public:
  // Depth past which the body is refused: protobuf's own default recursion limit.
  static constexpr int kMaxDepth = 100;

  // `shared`: names of main-graph initializers whose external reference to kSharedLocation is
  // not a file but a constant the kernel hands the inner session (kSharedAttribute).
  explicit WireScanner(const std::vector<std::string>* shared = nullptr) : shared_(shared) {}

  // The first tensor in `data` (a serialized `kind`) that refers to a file, described ("tensor
  // 'w' keeps its data in external file 'secret.txt'"); empty when there is none, or when the
  // bytes are not well-formed protobuf (onnxruntime then refuses them itself).
  std::string Find(std::string_view data, Message kind, int depth = 0) {
    if (depth > kMaxDepth) {
      too_deep_ = true;
      return "";
    }
    std::string name, entry_key, entry_value, found;
    bool external = false;
    const char* p = data.data();
    const char* end = p + data.size();
    while (p < end && found.empty() && !too_deep_) {
      uint64_t key = 0, value = 0;
      if (!Varint(p, end, key)) return "";
      const uint64_t field = key >> 3, wire = key & 7;
      if (wire == 2) {
        if (!Varint(p, end, value) || value > static_cast<uint64_t>(end - p)) return "";
        const std::string_view payload(p, static_cast<size_t>(value));
        p += value;
        if (kind == Message::kTensor && field == 8) name = payload;
        if (kind == Message::kEntry) (field == 1 ? entry_key : entry_value) = payload;
        if (kind == Message::kTensor && field == 13) {  // an external_data entry: the tensor refers to a file
          external = true;
          if (std::string file = Find(payload, Message::kEntry, depth + 1); !file.empty()) entry_value = file;
        } else if (auto child = ChildMessage(kind, field)) {
          found = Find(payload, *child, depth + 1);
        }
      } else if (wire == 0) {
        if (!Varint(p, end, value)) return "";
        if (kind == Message::kTensor && field == 14 && value == 1) external = true;  // data_location: EXTERNAL
      } else if (wire == 1 || wire == 5) {
        const size_t size = wire == 1 ? 8 : 4;
        if (static_cast<size_t>(end - p) < size) return "";
        p += size;
      } else {
        return "";  // groups (3, 4) and invalid wire types: not an ONNX model
      }
    }
    if (kind == Message::kEntry) return entry_key == "location" ? entry_value : "";
    if (external && depth == 2 && kind == Message::kTensor && IsShared(name, entry_value)) return found;
    if (external) {
      return "tensor '" + name + "' keeps its data in external file '" + (entry_value.empty() ? "?" : entry_value) + "'";
    }
    return found;
  }

  bool too_deep() const { return too_deep_; }

 private:
  static bool Varint(const char*& p, const char* end, uint64_t& value) { return ReadVarint(p, end, value); }

  // A main-graph initializer (depth 2: model, graph, tensor) standing for a shared constant.
  bool IsShared(const std::string& name, const std::string& location) const {
    return shared_ != nullptr && location == kSharedLocation &&
           std::find(shared_->begin(), shared_->end(), name) != shared_->end();
  }

  const std::vector<std::string>* shared_;
  bool too_deep_ = false;
};

// Refuses a body that refers to a file (see WireScanner), or nests too deep to be scanned.
void RefuseFileReferences(const std::string& body, const std::string& prefix, const std::vector<std::string>& shared) {
  WireScanner scanner(&shared);
  const std::string found = scanner.Find(body, Message::kModel);
  if (scanner.too_deep()) {
    throw BlockError(ORT_INVALID_GRAPH, prefix + "body nests subgraphs more than " +
                                            std::to_string(WireScanner::kMaxDepth) + " messages deep; refusing to run it");
  }
  if (!found.empty()) {
    throw BlockError(ORT_INVALID_GRAPH, prefix + "body refers to a file (" + found +
                                            "); a block body must hold its weights inline and the library never "
                                            "reads files for it; refusing to run it");
  }
}

// --- labels ----------------------------------------------------------------------------------
// A block's `precision` must say what its body computes (docs/precision.md, "Labels say what the
// body computes"): an int8 body holds quantized arithmetic -- a quantized operator (QuantizeLinear,
// DequantizeLinear, DynamicQuantizeLinear, QLinear*, ConvInteger, MatMulInteger, contrib Q* ops)
// or an 8-bit integer initializer cast to a float type (INT8 weights written as Cast and a scale)
// -- and an fp16 body holds a float16 value (an initializer, a Cast to float16, or a graph input,
// output or value_info of that type). The body's main graph is read in protobuf's wire format
// (onnx.proto field numbers); onnxmlu's Python readers apply the same rule (schema.label_mismatch).
constexpr uint64_t kFloat = 1, kUint8 = 2, kInt8 = 3, kFloat16 = 10, kDouble = 11, kBfloat16 = 16;

// Calls `visit(field, wire, value, payload)` for each field of the message in `data` (`value` for
// varints, `payload` for length-delimited fields); false when the bytes are not well-formed.
template <typename Visit>
bool ForEachField(std::string_view data, Visit&& visit) {
  const char* p = data.data();
  const char* end = p + data.size();
  while (p < end) {
    uint64_t key = 0, value = 0;
    if (!ReadVarint(p, end, key)) return false;
    const uint64_t field = key >> 3, wire = key & 7;
    std::string_view payload;
    if (wire == 0) {
      if (!ReadVarint(p, end, value)) return false;
    } else if (wire == 2) {
      if (!ReadVarint(p, end, value) || value > static_cast<uint64_t>(end - p)) return false;
      payload = std::string_view(p, static_cast<size_t>(value));
      p += value;
    } else if (wire == 1 || wire == 5) {
      const size_t size = wire == 1 ? 8 : 4;
      if (static_cast<size_t>(end - p) < size) return false;
      p += size;
    } else {
      return false;
    }
    visit(field, wire, value, payload);
  }
  return true;
}

bool IsQuantizedOperator(std::string_view op) {
  return op == "DequantizeLinear" || op == "ConvInteger" || op == "MatMulInteger" ||
         op.find("Quantize") != std::string_view::npos ||  // QuantizeLinear, DynamicQuantizeLinear, DynamicQuantizeLSTM
         (op.size() > 1 && op[0] == 'Q' && op[1] >= 'A' && op[1] <= 'Z');
}

bool IsFloatType(uint64_t type) {
  return type == kFloat || type == kFloat16 || type == kDouble || type == kBfloat16;
}

// What a body's main graph holds that a label needs.
class LabelEvidence {
 public:
  explicit LabelEvidence(std::string_view model) {
    ForEachField(model, [&](uint64_t field, uint64_t wire, uint64_t, std::string_view payload) {
      if (field == 7 && wire == 2) Graph(payload);  // ModelProto.graph
    });
  }

  bool quantized() const {
    if (quantized_operator_) return true;
    return std::any_of(casts_.begin(), casts_.end(), [&](const auto& cast) {
      return IsFloatType(cast.second) && std::find(eight_bit_.begin(), eight_bit_.end(), cast.first) != eight_bit_.end();
    });
  }
  bool float16() const { return float16_; }

 private:
  void Graph(std::string_view graph) {
    ForEachField(graph, [&](uint64_t field, uint64_t wire, uint64_t, std::string_view payload) {
      if (wire != 2) return;
      if (field == 1) Node(payload);                                    // node
      if (field == 5) Initializer(payload);                             // initializer
      if (field == 11 || field == 12 || field == 13) ValueInfo(payload);  // input, output, value_info
    });
  }

  void Node(std::string_view node) {
    std::string_view op, first_input;
    bool has_input = false;
    uint64_t to = 0;
    ForEachField(node, [&](uint64_t field, uint64_t wire, uint64_t, std::string_view payload) {
      if (wire != 2) return;
      if (field == 4) op = payload;  // op_type
      if (field == 1 && !has_input) first_input = payload, has_input = true;
      if (field == 5) to = CastTarget(payload, to);  // attribute
    });
    if (IsQuantizedOperator(op)) quantized_operator_ = true;
    if (op == "Cast" && has_input) {
      casts_.emplace_back(first_input, to);
      if (to == kFloat16) float16_ = true;
    }
  }

  // The value of an attribute named "to" (AttributeProto.name 1, i 3), else `previous`.
  static uint64_t CastTarget(std::string_view attribute, uint64_t previous) {
    std::string_view name;
    uint64_t i = 0;
    ForEachField(attribute, [&](uint64_t field, uint64_t wire, uint64_t value, std::string_view payload) {
      if (field == 1 && wire == 2) name = payload;
      if (field == 3 && wire == 0) i = value;
    });
    return name == "to" ? i : previous;
  }

  void Initializer(std::string_view tensor) {  // TensorProto.data_type 2, name 8
    uint64_t type = 0;
    std::string_view name;
    ForEachField(tensor, [&](uint64_t field, uint64_t wire, uint64_t value, std::string_view payload) {
      if (field == 2 && wire == 0) type = value;
      if (field == 8 && wire == 2) name = payload;
    });
    if (type == kInt8 || type == kUint8) eight_bit_.push_back(name);
    if (type == kFloat16) float16_ = true;
  }

  void ValueInfo(std::string_view info) {  // ValueInfoProto.type 2 -> TypeProto.tensor_type 1 -> elem_type 1
    ForEachField(info, [&](uint64_t field, uint64_t wire, uint64_t, std::string_view type) {
      if (field != 2 || wire != 2) return;
      ForEachField(type, [&](uint64_t f, uint64_t w, uint64_t, std::string_view tensor) {
        if (f != 1 || w != 2) return;
        ForEachField(tensor, [&](uint64_t g, uint64_t x, uint64_t elem, std::string_view) {
          if (g == 1 && x == 0 && elem == kFloat16) float16_ = true;
        });
      });
    });
  }

  bool quantized_operator_ = false;
  bool float16_ = false;
  std::vector<std::string_view> eight_bit_;                    // 8-bit integer initializers
  std::vector<std::pair<std::string_view, uint64_t>> casts_;  // (input, to) of each Cast
};

// Refuses a label the body does not bear out (an int8 or fp16 label on an FP32 body).
void CheckLabel(const std::string& body, const std::string& precision, const std::string& prefix) {
  if (precision != "int8" && precision != "fp16") return;
  const LabelEvidence evidence(body);
  std::string mismatch;
  if (precision == "int8" && !evidence.quantized()) {
    mismatch = "labelled int8 but its body holds no quantized operator and no 8-bit integer weight cast to float";
  } else if (precision == "fp16" && !evidence.float16()) {
    mismatch = "labelled fp16 but its body holds no float16 tensor";
  }
  if (!mismatch.empty()) {
    throw BlockError(ORT_INVALID_GRAPH, prefix + mismatch + "; a block's precision must say what its body computes");
  }
}

// Hardware threads this process may use: the CPU affinity mask (containers, taskset) when it
// is narrower than what std::thread::hardware_concurrency reports.
int64_t HardwareThreads() {
  int64_t threads = std::thread::hardware_concurrency();
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int64_t allowed = CPU_COUNT(&set);
    if (allowed > 0 && (threads == 0 || allowed < threads)) threads = allowed;
  }
  return threads > 0 ? threads : 1;
}

// Thread count of an inner session: the environment override, else the registration's
// setting (the user's thread budget), else the block's MP capped at the hardware threads.
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

// Text of the error the nested-op variant raises; the outer kernel recognises it.
constexpr const char* kNestedMessage = "blocks cannot be nested";

OrtCustomOpDomain* NestedDomain();

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

// The thread report's counters (OnnxmluThreadReport, indices as documented in the header).
std::array<std::atomic<int64_t>, 5> g_thread_report{};
enum ReportIndex { kOwnPools, kOwnWorkers, kGlobalSessions, kOwnPoolRuns, kGlobalRuns };

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
// s8 x s8 kernel is exact), and a weight shared by several nodes is added twice.
constexpr const char* kExactInt8Failures[] = {"Failed to find kernel", "Attempt to replace the existing tensor"};

bool IsExactInt8Failure(const std::string& message) {
  for (const char* known : kExactInt8Failures) {
    if (message.find(known) != std::string::npos) return true;
  }
  return false;
}

// The node's shared weights (kSharedAttribute): its last inputs, each a constant of the outer
// graph, named as the body's initializer it replaces. Read once, at kernel creation: onnxruntime
// keeps the constants for the outer session's life, and the inner session copies them in.
struct SharedWeights {
  std::vector<std::string> names;
  std::vector<const OrtValue*> values;
};

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

// The shared weights as onnxruntime takes them (AddExternalInitializers: tensors over a buffer
// they do not own), made once per kernel and kept until its inner session is made.
struct SharedViews {
  std::vector<OrtPtr<OrtValue>> views;
  std::vector<const char*> names;
  std::vector<const OrtValue*> values;
};

SharedViews ViewsOf(const SharedWeights& shared, const std::string& prefix) {
  SharedViews result;
  for (size_t i = 0; i < shared.names.size(); ++i) {
    result.views.push_back(ViewOf(shared.values[i], prefix));
    result.names.push_back(shared.names[i].c_str());
    result.values.push_back(result.views.back().get());
  }
  return result;
}

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

// The inner session of a body: on the env's global pool where it has one (or the user demands
// it), so every block of every model in the process shares one pool as the process's plain
// sessions do; otherwise on a pool of its own. Returns onnxruntime's error for the body, if any.
OrtStatus* CreateInnerSession(OrtEnv* env, const std::string& body, int threads, const InnerConfig& config,
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
    : node_name_(ReadNodeName(info)) {
  std::string prefix = Prefix(node_name_);
  mp_ = ReadMp(info, prefix);
  const std::string precision = ReadPrecision(info, prefix);
  std::string body = ReadBody(info, prefix);
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
  std::string().swap(body);  // the inner session holds what it needs: free the copy now

  size_t node_inputs = 0, node_outputs = 0, body_inputs = 0, body_outputs = 0;
  Check(Api().KernelInfo_GetInputCount(info, &node_inputs), prefix);
  Check(Api().KernelInfo_GetOutputCount(info, &node_outputs), prefix);
  Check(Api().SessionGetInputCount(session_.get(), &body_inputs), prefix);
  Check(Api().SessionGetOutputCount(session_.get(), &body_outputs), prefix);
  node_inputs -= shared.names.size();  // the shared weights are the body's initializers, not its inputs
  if (body_inputs != node_inputs) {
    throw BlockError(ORT_INVALID_GRAPH, prefix + "body has " + std::to_string(body_inputs) + " inputs but the node has " +
                                            std::to_string(node_inputs) + " (besides its shared weights)");
  }
  if (body_outputs != node_outputs) {
    throw BlockError(ORT_INVALID_GRAPH, prefix + "body has " + std::to_string(body_outputs) + " outputs but the node has " +
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
  for (const auto& name : output_names_) output_name_ptrs_.push_back(name.c_str());
  bool dynamic = std::any_of(outputs_.begin(), outputs_.end(), [](const OutputPlan& o) { return !o.is_static; });
  learn_shapes_ = dynamic && ReadBodyMetadata(session_.get(), kOutputShapesKey, prefix) == kFollowInputShapes;
}

std::string FusionBlockKernel::BlockName() const { return Prefix(node_name_); }

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
    return MakeStatus(error.code(), error.what());
  } catch (const std::exception& error) {
    return MakeStatus(ORT_FAIL, BlockName() + error.what());
  } catch (...) {
    return MakeStatus(ORT_FAIL, BlockName() + "unknown error while running the block");
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
  // Static outputs, and dynamic ones whose shapes a run at these input shapes taught us: the
  // inner session writes into the node's own output buffers (no copy).
  std::vector<int64_t> key;
  std::optional<Shapes> learned;
  if (learn_shapes_) {
    key = InputShapeKey(inputs, BlockName());
    learned = LearnedShapes(key);
  }
  std::vector<bool> in_place(n_outputs, false);
  std::vector<OrtValue*> outputs(n_outputs, nullptr);
  for (size_t i = 0; i < n_outputs; ++i) {
    const OutputPlan& plan = outputs_[i];
    const bool learnable = learned && plan.widen_from == ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  // else converted after
    const std::vector<int64_t>* dims = plan.is_static ? &plan.dims : (learnable ? &(*learned)[i] : nullptr);
    if (dims == nullptr) continue;
    if (OrtStatus* s = Api().KernelContext_GetOutput(context, i, dims->data(), dims->size(), &outputs[i])) {
      Check(s, BlockName());
    }
    in_place[i] = true;
  }
  if (pool_use_.global || pool_use_.own_workers > 0) {
    g_thread_report[pool_use_.global ? kGlobalRuns : kOwnPoolRuns].fetch_add(1, std::memory_order_relaxed);
  }
  OrtStatus* status = Api().Run(session_.get(), nullptr, input_name_ptrs_.data(), inputs.data(), n_inputs,
                                output_name_ptrs_.data(), n_outputs, outputs.data());
  // Outputs the inner session allocated are ours to release, whatever happens next.
  std::vector<OrtPtr<OrtValue>> owned(n_outputs);
  for (size_t i = 0; i < n_outputs; ++i) {
    if (!in_place[i]) owned[i].reset(outputs[i]);
  }
  if (status != nullptr) Check(status, BlockName());
  Shapes seen(n_outputs);
  for (size_t i = 0; i < n_outputs; ++i) {
    if (!in_place[i]) seen[i] = CopyDynamicOutput(context, i, owned[i].get());
  }
  if (learn_shapes_ && !learned) Learn(std::move(key), std::move(seen));
}

// A float tensor rounded to float16 or bfloat16 (to nearest even, as onnxruntime's Cast does).
OrtPtr<OrtValue> FusionBlockKernel::Narrow(const OrtValue* value, ONNXTensorElementDataType type) const {
  const std::string prefix = BlockName();
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
  const std::string prefix = BlockName();
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

OrtStatusPtr FusionBlockOp::CreateKernelV2(const OrtApi& /*api*/, const OrtKernelInfo* info, void** kernel) const noexcept {
  *kernel = nullptr;
  try {
    if (nested_) {
      throw BlockError(ORT_INVALID_GRAPH, Prefix(ReadNodeName(info)) + "this node is inside another block's body; " + kNestedMessage);
    }
    *kernel = new FusionBlockKernel(info, config_);
    return nullptr;
  } catch (const BlockError& error) {
    return MakeStatus(error.code(), error.what());
  } catch (const std::exception& error) {
    return MakeStatus(ORT_FAIL, Prefix(ReadNodeName(info)) + "cannot create the kernel: " + error.what());
  } catch (...) {
    return MakeStatus(ORT_FAIL, Prefix(ReadNodeName(info)) + "cannot create the kernel: unknown error");
  }
}

namespace {

// Ops and domains must outlive every session that uses them: they live for the whole process
// (onnxruntime never takes ownership of a custom-op domain), created once per distinct
// InnerConfig (a handful per process), shared by all session options registered with it.
FusionBlockOp g_nested_op(/*nested=*/true, InnerConfig{});

OrtCustomOpDomain* MakeDomain(FusionBlockOp* op) {
  OrtCustomOpDomain* domain = nullptr;
  Check(Api().CreateCustomOpDomain(kDomain, &domain), "onnxmlu: ");
  OrtStatus* status = Api().CustomOpDomain_Add(domain, op);
  if (status != nullptr) {
    Api().ReleaseCustomOpDomain(domain);
    Check(status, "onnxmlu: ");
  }
  return domain;
}

OrtCustomOpDomain* BlockDomain(const InnerConfig& config) {
  struct Registered {
    std::unique_ptr<FusionBlockOp> op;  // heap: onnxruntime keeps pointers to it
    OrtCustomOpDomain* domain;
  };
  static std::mutex mutex;
  static std::map<InnerConfig, Registered> registry;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = registry.find(config);
  if (found != registry.end()) return found->second.domain;
  auto op = std::make_unique<FusionBlockOp>(/*nested=*/false, config);
  OrtCustomOpDomain* domain = MakeDomain(op.get());
  registry.emplace(config, Registered{std::move(op), domain});
  return domain;
}

// Reads an optional session config entry; false when it is absent.
bool ReadConfigEntry(const OrtApi& api, const OrtSessionOptions* options, const char* key, std::string* value) {
  int present = 0;
  Check(api.HasSessionConfigEntry(options, key, &present), "onnxmlu: ");
  if (!present) return false;
  size_t size = 0;
  Check(api.GetSessionConfigEntry(options, key, nullptr, &size), "onnxmlu: ");
  value->assign(size, '\0');
  Check(api.GetSessionConfigEntry(options, key, value->data(), &size), "onnxmlu: ");
  value->resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
  return true;
}

// The inner-session set-up asked for by the options' config entries (see the header).
InnerConfig ReadInnerConfig(const OrtApi& api, const OrtSessionOptions* options) {
  InnerConfig config;
  std::string text;
  if (ReadConfigEntry(api, options, kInnerThreadsKey, &text)) {
    char* end = nullptr;
    errno = 0;
    long value = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || errno != 0 || *end != '\0' || value < 0 || value > 4096) {
      throw BlockError(ORT_INVALID_ARGUMENT, std::string("onnxmlu: session config entry ") + kInnerThreadsKey +
                                                 " must be an integer from 0 to 4096, got '" + text + "'");
    }
    config.threads = static_cast<int>(value);
  }
  if (ReadConfigEntry(api, options, kInnerSpinningKey, &text)) {
    if (text != "0" && text != "1") {
      throw BlockError(ORT_INVALID_ARGUMENT, std::string("onnxmlu: session config entry ") + kInnerSpinningKey +
                                                 " must be '0' or '1', got '" + text + "'");
    }
    config.spinning = text == "1";
  }
  if (ReadConfigEntry(api, options, kInnerGlobalPoolKey, &text)) {
    if (text != "0" && text != "1") {
      throw BlockError(ORT_INVALID_ARGUMENT, std::string("onnxmlu: session config entry ") + kInnerGlobalPoolKey +
                                                 " must be '0' or '1', got '" + text + "'");
    }
    config.global_pool = text == "1" ? GlobalPool::kRequire : GlobalPool::kNever;
  }
  return config;
}

OrtCustomOpDomain* NestedDomain() {
  static OrtCustomOpDomain* domain = MakeDomain(&g_nested_op);
  return domain;
}

}  // namespace
}  // namespace onnxmlu

extern "C" OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  if (api_base == nullptr) return nullptr;  // nothing to report an error through
  const OrtApi* api = api_base->GetApi(onnxmlu::kOrtApiVersion);
  if (api == nullptr) {
    const OrtApi* oldest = api_base->GetApi(1);
    if (oldest == nullptr) return nullptr;
    std::string message = std::string("libonnxmlu_ops needs onnxruntime >= 1.21 (C API version ") +
                          std::to_string(onnxmlu::kOrtApiVersion) + "), this is onnxruntime " +
                          api_base->GetVersionString();
    return oldest->CreateStatus(ORT_FAIL, message.c_str());
  }
  Ort::InitApi(api);
  // Registering twice into one SessionOptions would fail session creation ("Domain already set
  // in registry"); the marker entry makes registration idempotent and tells Python it happened.
  int registered = 0;
  if (OrtStatus* status = api->HasSessionConfigEntry(options, onnxmlu::kRegisteredKey, &registered)) {
    return status;
  }
  if (registered) return nullptr;
  try {
    const onnxmlu::InnerConfig config = onnxmlu::ReadInnerConfig(*api, options);
    if (OrtStatus* status = api->AddCustomOpDomain(options, onnxmlu::BlockDomain(config))) return status;
    return api->AddSessionConfigEntry(options, onnxmlu::kRegisteredKey, "1");
  } catch (const onnxmlu::BlockError& error) {
    return onnxmlu::MakeStatus(error.code(), error.what());
  } catch (const std::exception& error) {
    return api->CreateStatus(ORT_FAIL, error.what());
  } catch (...) {
    return api->CreateStatus(ORT_FAIL, "onnxmlu: cannot register the custom-op domain");
  }
}

extern "C" int64_t OnnxmluThreadReport(int64_t* values, int64_t count) {
  const auto& report = onnxmlu::g_thread_report;
  for (int64_t i = 0; values != nullptr && i < count && i < static_cast<int64_t>(report.size()); ++i) {
    values[i] = report[i].load(std::memory_order_relaxed);
  }
  return static_cast<int64_t>(report.size());
}
