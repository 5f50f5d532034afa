// The node's attributes, read and checked at kernel creation: `mp`, `precision`, `body` (and its
// `body_crc32` digest, its file references, its label) and `shared_weights`. Every failure is a
// BlockError whose message starts with the node's prefix.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ort_support.h"

namespace onnxmlu {

std::string ReadNodeName(const OrtKernelInfo* info);
// "MLUFusionBlock '<name>': ", the start of every message about the node.
std::string Prefix(const std::string& node_name);

int64_t ReadMp(const OrtKernelInfo* info, const std::string& prefix);
// The `precision` label ("fp32" when absent); CheckLabel later holds the body to it.
std::string ReadPrecision(const OrtKernelInfo* info, const std::string& prefix);
// The serialized body, TENSOR(uint8) (the format onnxmlu writes) or STRING (older files), held
// where onnxruntime's C API put it. The API makes one copy of the attribute either way and has no
// call that exposes the node's own bytes: KernelInfoGetAttribute_tensor unpacks the TensorProto
// into a new tensor, KernelInfoGetAttribute_string fills a buffer. The library adds none: the
// digest, the scans, the label rule and the inner session read bytes() in place.
class BodyBytes {
 public:
  std::string_view bytes() const;
  void Release();  // the inner session holds what it needs: free the copy

 private:
  friend BodyBytes ReadBody(const OrtKernelInfo* info, const std::string& prefix);
  OrtPtr<OrtValue> tensor_;  // a TENSOR body
  std::string text_;         // a STRING body
};
BodyBytes ReadBody(const OrtKernelInfo* info, const std::string& prefix);

// Refuses a body whose bytes changed since its digest was written.
void VerifyDigest(std::string_view body, const OrtKernelInfo* info, const std::string& prefix);
// Refuses a body that refers to a file (body_scan.h), or nests too deep to be scanned.
void RefuseFileReferences(std::string_view body, const std::string& prefix, const std::vector<std::string>& shared);
// Refuses a label the body does not bear out (label_rule.h).
void CheckLabel(std::string_view body, const std::string& precision, const std::string& prefix);

// The node's shared weights (kSharedAttribute): its last inputs, each a constant of the outer
// graph, named as the body's initializer it replaces. Read once, at kernel creation: onnxruntime
// keeps the constants for the outer session's life, and the inner session copies them in.
struct SharedWeights {
  std::vector<std::string> names;
  std::vector<const OrtValue*> values;
};
SharedWeights ReadSharedWeights(const OrtKernelInfo* info, const std::string& prefix);

}  // namespace onnxmlu
