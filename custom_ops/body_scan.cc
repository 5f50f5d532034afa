#include "body_scan.h"

#include <algorithm>
#include <optional>

namespace onnxmlu {

namespace {

// Must equal kSharedLocation in mlu_fusion_block.h (this unit does not include onnxruntime).
constexpr std::string_view kOuterConstant = "onnxmlu:outer-constant";

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

class WireScanner {
 public:
  explicit WireScanner(const std::vector<std::string>* shared) : shared_(shared) {}

  // The first tensor in `data` (a serialized `kind`) that refers to a file (see FileReferenceScan).
  std::string Find(std::string_view data, Message kind, int depth = 0) {
    if (depth > kMaxScanDepth) {
      too_deep_ = true;
      return "";
    }
    std::string name, entry_key, entry_value, found;
    bool external = false;
    const char* p = data.data();
    const char* end = p + data.size();
    while (p < end && found.empty() && !too_deep_) {
      uint64_t key = 0, value = 0;
      if (!ReadVarint(p, end, key)) return "";
      const uint64_t field = key >> 3, wire = key & 7;
      if (wire == 2) {
        if (!ReadVarint(p, end, value) || value > static_cast<uint64_t>(end - p)) return "";
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
        if (!ReadVarint(p, end, value)) return "";
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
  // A main-graph initializer (depth 2: model, graph, tensor) standing for a shared constant.
  bool IsShared(const std::string& name, const std::string& location) const {
    return shared_ != nullptr && location == kOuterConstant &&
           std::find(shared_->begin(), shared_->end(), name) != shared_->end();
  }

  const std::vector<std::string>* shared_;
  bool too_deep_ = false;
};

}  // namespace

bool ReadVarint(const char*& p, const char* end, uint64_t& value) noexcept {
  value = 0;
  for (int shift = 0; shift < 64 && p < end; shift += 7) {
    const auto byte = static_cast<unsigned char>(*p++);
    value |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

FileReferenceScan ScanFileReferences(std::string_view model, const std::vector<std::string>& shared) {
  WireScanner scanner(&shared);
  FileReferenceScan result;
  result.found = scanner.Find(model, Message::kModel);
  result.too_deep = scanner.too_deep();
  return result;
}

}  // namespace onnxmlu
