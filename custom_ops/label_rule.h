// The label rule: a block's `precision` must say what its body computes (docs/precision.md,
// "Labels say what the body computes"): an int8 body holds quantized arithmetic -- a quantized
// operator (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinear*, ConvInteger,
// MatMulInteger, contrib Q* ops) or an 8-bit integer initializer cast to a float type (INT8
// weights written as Cast and a scale) -- and an fp16 body holds a float16 value (an initializer,
// a Cast to float16, or a graph input, output or value_info of that type). The body's main graph
// is read in protobuf's wire format, in place; onnxmlu's Python readers apply the same rule
// (onnxmlu/schema.py, label_mismatch), and both are tested on the cases of
// tests/data/label_rule_cases.json. No onnxruntime dependency: the unit tests link it alone.
#pragma once

#include <string>
#include <string_view>

namespace onnxmlu {

// Whether an operator type is quantized arithmetic (the list above).
bool IsQuantizedOperator(std::string_view op) noexcept;

// Why the serialized ModelProto `body` is not what a block labelled `precision` computes, or ""
// when it is (any precision other than int8 and fp16 needs nothing of the body).
std::string LabelMismatch(std::string_view body, std::string_view precision);

}  // namespace onnxmlu
