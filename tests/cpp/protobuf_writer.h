// Serialized ONNX messages written field by field (protobuf's wire format, onnx.proto field
// numbers), so the tests build good, truncated and hostile bodies without a protobuf library.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace onnxmlu_tests {

inline std::string Varint(uint64_t value) {
  std::string out;
  do {
    unsigned char byte = value & 0x7F;
    value >>= 7;
    if (value != 0) byte |= 0x80;
    out += static_cast<char>(byte);
  } while (value != 0);
  return out;
}

// A length-delimited field (wire type 2): sub-messages, strings, bytes.
inline std::string Bytes(uint64_t field, std::string_view payload) {
  return Varint(field << 3 | 2) + Varint(payload.size()) + std::string(payload);
}

// A varint field (wire type 0): ints and enums.
inline std::string Int(uint64_t field, uint64_t value) { return Varint(field << 3) + Varint(value); }

// TensorProto.DataType values.
enum DataType : uint64_t { kFloat = 1, kUint8 = 2, kInt8 = 3, kInt64 = 7, kFloat16 = 10, kDouble = 11, kBfloat16 = 16 };

// onnx.proto messages, each the concatenation of its fields.
inline std::string Model(std::string_view graph) { return Int(1, 8) + Bytes(7, graph); }  // ir_version, graph
inline std::string GraphNode(std::string_view node) { return Bytes(1, node); }
inline std::string GraphInitializer(std::string_view tensor) { return Bytes(5, tensor); }
inline std::string GraphInput(std::string_view info) { return Bytes(11, info); }
inline std::string GraphOutput(std::string_view info) { return Bytes(12, info); }
inline std::string GraphValueInfo(std::string_view info) { return Bytes(13, info); }

inline std::string Tensor(std::string_view name, uint64_t type) {
  return Int(1, 1) + Int(2, type) + Bytes(8, name);  // dims [1], data_type, name
}
// A tensor whose data lives in external file `location` (TensorProto.external_data, data_location).
inline std::string ExternalTensor(std::string_view name, std::string_view location) {
  const std::string entry = Bytes(1, "location") + Bytes(2, location);
  return Tensor(name, kFloat) + Bytes(13, entry) + Int(14, 1);
}

inline std::string ValueInfo(std::string_view name, uint64_t elem_type) {
  const std::string tensor_type = Int(1, elem_type);
  const std::string type = Bytes(1, tensor_type);
  return Bytes(1, name) + Bytes(2, type);
}

inline std::string IntAttribute(std::string_view name, uint64_t value) {
  return Bytes(1, name) + Int(3, value) + Int(20, 2);  // name, i, type INT
}
inline std::string GraphAttribute(std::string_view name, std::string_view graph) {
  return Bytes(1, name) + Bytes(6, graph) + Int(20, 5);  // name, g, type GRAPH
}

inline std::string Node(std::string_view op, std::initializer_list<std::string_view> inputs, std::string_view output,
                        std::initializer_list<std::string> attributes = {}) {
  std::string node;
  for (std::string_view input : inputs) node += Bytes(1, input);
  node += Bytes(2, output) + Bytes(4, op);
  for (const std::string& attribute : attributes) node += Bytes(5, attribute);
  return node;
}

}  // namespace onnxmlu_tests
