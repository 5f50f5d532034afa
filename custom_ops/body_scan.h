// The body's bytes read in protobuf's wire format (onnx.proto field numbers), before onnxruntime
// parses them: the file-reference scan here, the label rule (label_rule.h) on ForEachField. No
// onnxruntime dependency: the unit tests link it alone.
//
// A body must hold its weights inline. A tensor with external data names a file that the inner
// session (made from bytes, with no model path) would resolve against the process's working
// directory, not the model's folder: a downloaded model could read ./secret.txt into its output.
// The scan descends only into the messages that can hold a tensor, and never copies the body.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace onnxmlu {

// Depth past which a body is refused: protobuf's own default recursion limit.
inline constexpr int kMaxScanDepth = 100;

// Reads one protobuf varint at `p` (advanced past it); false when it runs past `end`.
bool ReadVarint(const char*& p, const char* end, uint64_t& value) noexcept;

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

struct FileReferenceScan {
  // The first tensor that refers to a file, described ("tensor 'w' keeps its data in external
  // file 'secret.txt'"); empty when there is none, or when the bytes are not well-formed protobuf
  // (onnxruntime then refuses them itself).
  std::string found;
  bool too_deep = false;  // nests more than kMaxScanDepth messages: not scanned to the end
};

// Scans a serialized ModelProto. `shared`: names of main-graph initializers whose external
// reference to kSharedLocation (mlu_fusion_block.h) is not a file but a constant the kernel
// hands the inner session (kSharedAttribute).
FileReferenceScan ScanFileReferences(std::string_view model, const std::vector<std::string>& shared);

}  // namespace onnxmlu
