#include "label_rule.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "body_scan.h"

namespace onnxmlu {

namespace {

// TensorProto.DataType values (onnx.proto).
constexpr uint64_t kFloat = 1, kUint8 = 2, kInt8 = 3, kFloat16 = 10, kDouble = 11, kBfloat16 = 16;

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
  // Whether an initializer, a Cast target or a graph value has TensorProto type `type`.
  bool holds_type(uint64_t type) const { return type < 64 && (types_ >> type & 1) != 0; }

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
      Saw(to);
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
    Saw(type);
  }

  void ValueInfo(std::string_view info) {  // ValueInfoProto.type 2 -> TypeProto.tensor_type 1 -> elem_type 1
    ForEachField(info, [&](uint64_t field, uint64_t wire, uint64_t, std::string_view type) {
      if (field != 2 || wire != 2) return;
      ForEachField(type, [&](uint64_t f, uint64_t w, uint64_t, std::string_view tensor) {
        if (f != 1 || w != 2) return;
        ForEachField(tensor, [&](uint64_t g, uint64_t x, uint64_t elem, std::string_view) {
          if (g == 1 && x == 0) Saw(elem);
        });
      });
    });
  }

  void Saw(uint64_t type) {
    if (type < 64) types_ |= uint64_t{1} << type;
  }

  bool quantized_operator_ = false;
  uint64_t types_ = 0;  // bit t: a value of TensorProto type t
  std::vector<std::string_view> eight_bit_;                    // 8-bit integer initializers
  std::vector<std::pair<std::string_view, uint64_t>> casts_;  // (input, to) of each Cast
};

}  // namespace

bool IsQuantizedOperator(std::string_view op) noexcept {
  return op == "DequantizeLinear" || op == "ConvInteger" || op == "MatMulInteger" ||
         op.find("Quantize") != std::string_view::npos ||  // QuantizeLinear, DynamicQuantizeLinear, DynamicQuantizeLSTM
         (op.size() > 1 && op[0] == 'Q' && op[1] >= 'A' && op[1] <= 'Z');
}

const PrecisionLabel* FindPrecisionLabel(std::string_view name) noexcept {
  for (const PrecisionLabel& label : kPrecisionLabels) {
    if (label.name == name) return &label;
  }
  return nullptr;
}

std::string PrecisionLabelNames() {
  std::string names;
  for (size_t k = 0; k < kPrecisionLabels.size(); ++k) {
    if (k > 0) names += k + 1 == kPrecisionLabels.size() ? " or " : ", ";
    names += kPrecisionLabels[k].name;
  }
  return names;
}

std::string LabelMismatch(std::string_view body, std::string_view precision) {
  const PrecisionLabel* label = FindPrecisionLabel(precision);
  if (label == nullptr || label->holds == BodyHolds::kNothing) return "";
  const LabelEvidence evidence(body);
  const bool holds = label->holds == BodyHolds::kQuantized ? evidence.quantized() : evidence.holds_type(label->element_type);
  if (holds) return "";
  return "labelled " + std::string(label->name) + " but its body holds no " + std::string(label->holds_words);
}

}  // namespace onnxmlu
