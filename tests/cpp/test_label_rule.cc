// label_rule.h on the shared cases of tests/data/label_rule_cases.json (the Python rule,
// onnxmlu.schema.label_mismatch, answers the same file in tests/precision/test_label_rule_cases.py):
// each case's body is written in protobuf's wire format and LabelMismatch must say, for each label
// the file has a message for, exactly what the file says; the library's labels are the file's. Also: the quantized-operator names, and hostile bodies.
#include <fstream>
#include <sstream>
#include <string>

#include "check.h"
#include "json.h"
#include "label_rule.h"
#include "protobuf_writer.h"

namespace {

using namespace onnxmlu_tests;

uint64_t TypeNamed(const std::string& name) {
  if (name == "float") return kFloat;
  if (name == "float16") return kFloat16;
  if (name == "bfloat16") return kBfloat16;
  if (name == "double") return kDouble;
  if (name == "int8") return kInt8;
  if (name == "uint8") return kUint8;
  if (name == "int64") return kInt64;
  throw std::runtime_error("label_rule_cases.json: unknown type '" + name + "'");
}

// The serialized GraphProto a case describes (see the file's "about").
std::string GraphOf(const Json& spec) {
  std::string graph;
  int k = 0;
  for (const Json& node : spec["nodes"].items) {
    std::string message;
    for (const Json& input : node["inputs"].items) message += Bytes(1, input.text);
    message += Bytes(2, "o" + std::to_string(k++)) + Bytes(4, node["op"].text);
    if (node.has("to")) message += Bytes(5, IntAttribute("to", TypeNamed(node["to"].text)));
    if (node.has("then_branch")) message += Bytes(5, GraphAttribute("then_branch", GraphOf(node["then_branch"])));
    graph += GraphNode(message);
  }
  for (const Json& tensor : spec["initializers"].items) {
    graph += GraphInitializer(Tensor(tensor["name"].text, TypeNamed(tensor["type"].text)));
  }
  for (const Json& value : spec["values"].items) {
    const std::string info = ValueInfo(value["name"].text, TypeNamed(value["type"].text));
    const std::string& role = value["role"].text;
    graph += role == "input" ? GraphInput(info) : role == "output" ? GraphOutput(info) : GraphValueInfo(info);
  }
  return graph;
}

Json LoadCases() {
  std::ifstream file(LabelCasesPath());
  if (!file) throw std::runtime_error("cannot read " + LabelCasesPath());
  std::stringstream text;
  text << file.rdbuf();
  return JsonReader(text.str()).Document();
}

bool BearsOut(const Json& test_case, const std::string& label) {
  for (const Json& item : test_case["bears_out"].items) {
    if (item.text == label) return true;
  }
  return false;
}

TEST(label_rule_answers_every_shared_case) {
  const Json cases = LoadCases();
  CHECK(cases["cases"].items.size() >= 20);
  for (const Json& test_case : cases["cases"].items) {
    const std::string body = Model(GraphOf(test_case["body"]));
    CHECK_TEXT(onnxmlu::LabelMismatch(body, "fp32"), "");
    for (const auto& [label, message] : cases["messages"].members) {
      const std::string expected = BearsOut(test_case, label) ? "" : message.text;
      CHECK_TEXT(test_case["name"].text + " as " + label + ": " + onnxmlu::LabelMismatch(body, label),
                 test_case["name"].text + " as " + label + ": " + expected);
    }
  }
}

TEST(the_library_accepts_the_labels_of_the_shared_file) {
  // kPrecisionLabels (what ReadPrecision accepts, what LabelMismatch applies) lists the file's
  // labels in its order, and a label needs something of its body exactly when the file has its message.
  const Json cases = LoadCases();
  CHECK(cases["labels"].items.size() == onnxmlu::kPrecisionLabels.size());
  for (size_t k = 0; k < onnxmlu::kPrecisionLabels.size(); ++k) {
    const onnxmlu::PrecisionLabel& label = onnxmlu::kPrecisionLabels[k];
    CHECK_TEXT(std::string(label.name), cases["labels"].items[k].text);
    CHECK(onnxmlu::FindPrecisionLabel(label.name) == &label);
    CHECK((label.holds != onnxmlu::BodyHolds::kNothing) == cases["messages"].has(std::string(label.name)));
  }
  CHECK(onnxmlu::FindPrecisionLabel("fp8x") == nullptr && onnxmlu::FindPrecisionLabel("") == nullptr);
  CHECK_TEXT(onnxmlu::LabelMismatch(Model(""), "fp8x"), "");  // ReadPrecision refuses it first
}

TEST(quantized_operator_names) {
  for (const char* op : {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
                         "ConvInteger", "MatMulInteger", "QAttention", "DynamicQuantizeLSTM", "QGemm"}) {
    CHECK(onnxmlu::IsQuantizedOperator(op));
  }
  for (const char* op : {"", "Q", "Qx", "Conv", "MatMul", "Cast", "Quux"}) CHECK(!onnxmlu::IsQuantizedOperator(op));
}

TEST(label_rule_on_truncated_and_hostile_bodies) {
  // A body holding a QuantizeLinear: every truncation is read without overrunning (ASan in
  // `make sanitize`), and a hostile body is simply not evidence of anything.
  const std::string body = Model(GraphNode(Node("QuantizeLinear", {"x", "s"}, "q")));
  CHECK_TEXT(onnxmlu::LabelMismatch(body, "int8"), "");
  for (size_t size = 0; size < body.size(); ++size) {
    const std::string cut = body.substr(0, size);
    const std::string mismatch = onnxmlu::LabelMismatch(cut, "int8");
    CHECK(mismatch.empty() || mismatch.rfind("labelled int8 but", 0) == 0);
  }
  CHECK(!onnxmlu::LabelMismatch(std::string(16, '\xFF'), "fp16").empty());
  CHECK(!onnxmlu::LabelMismatch(Varint(7 << 3 | 2) + Varint(UINT64_MAX), "int8").empty());
}

}  // namespace
