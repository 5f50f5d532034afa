// The label rule: a block's `precision` must say what its body computes (docs/precision.md,
// "Labels say what the body computes"): an int8 body holds quantized arithmetic -- a quantized
// operator (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinear*, ConvInteger,
// MatMulInteger, contrib Q* ops) or an 8-bit integer initializer cast to a float type (INT8
// weights written as Cast and a scale) -- and an fp16 body holds a float16 value (an initializer,
// a Cast to float16, or a graph input, output or value_info of that type): kPrecisionLabels below. The body's main graph
// is read in protobuf's wire format, in place; onnxmlu's Python readers apply the same rule
// (onnxmlu/schema.py, label_mismatch), and both are tested on the cases of
// tests/data/label_rule_cases.json. No onnxruntime dependency: the unit tests link it alone.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace onnxmlu {

// What a block's body must hold to bear its label out.
enum class BodyHolds { kNothing, kQuantized, kElementType };

// One label a block may bear: a precision of onnxmlu/precisions.py's records, in their order,
// with what its body must hold (kElementType: a value of TensorProto type `element_type`) and
// the words the mismatch ends with (the record's `body_holds`). The one list the library reads:
// ReadPrecision accepts these names and LabelMismatch applies these rules; the shared cases file
// lists the same names (tests/data/label_rule_cases.json, "labels"; both test suites compare).
struct PrecisionLabel {
  std::string_view name;
  BodyHolds holds;
  uint64_t element_type;  // TensorProto.DataType, for kElementType
  std::string_view holds_words;
};

inline constexpr std::array<PrecisionLabel, 3> kPrecisionLabels = {{
    {"fp32", BodyHolds::kNothing, 0, ""},
    {"fp16", BodyHolds::kElementType, 10, "float16 tensor"},
    {"int8", BodyHolds::kQuantized, 0, "quantized operator and no 8-bit integer weight cast to float"},
}};

// The label named `name`, or nullptr when no precision has that name.
const PrecisionLabel* FindPrecisionLabel(std::string_view name) noexcept;

// The label names as a sentence lists them: "fp32, fp16 or int8".
std::string PrecisionLabelNames();

// Whether an operator type is quantized arithmetic (the list above).
bool IsQuantizedOperator(std::string_view op) noexcept;

// Why the serialized ModelProto `body` is not what a block labelled `precision` computes, or ""
// when it is (a label whose row holds kNothing needs nothing of the body; a name no row has is
// ReadPrecision's to refuse, and needs nothing here).
std::string LabelMismatch(std::string_view body, std::string_view precision);

}  // namespace onnxmlu
