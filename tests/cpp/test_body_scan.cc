// body_scan.h: the file-reference scan on good bodies, bodies that refer to files (in the main
// graph, in a subgraph, through data_location alone), shared-weight placeholders, nesting past
// protobuf's limit, and truncated or hostile bytes (never read past the end: ASan in
// `make sanitize`), plus the varint reader and ForEachField.
#include <string>
#include <vector>

#include "body_scan.h"
#include "check.h"
#include "protobuf_writer.h"

namespace {

using namespace onnxmlu_tests;
using onnxmlu::FileReferenceScan;
using onnxmlu::ScanFileReferences;

const std::vector<std::string> kNoShared;
const char kOuterConstant[] = "onnxmlu:outer-constant";  // mlu_fusion_block.h kSharedLocation

std::string ReluGraph(std::string_view extra = "") {
  return GraphNode(Node("Relu", {"x"}, "y")) + GraphInitializer(Tensor("w", kFloat)) +
         GraphInput(ValueInfo("x", kFloat)) + GraphOutput(ValueInfo("y", kFloat)) + std::string(extra);
}

// A graph holding an If whose then-branch is `branch`.
std::string GraphWithBranch(std::string_view branch) {
  return GraphNode(Node("If", {"c"}, "y", {GraphAttribute("then_branch", branch)})) + GraphInput(ValueInfo("c", 9));
}

TEST(scan_passes_a_body_with_inline_weights) {
  const FileReferenceScan scan = ScanFileReferences(Model(ReluGraph()), kNoShared);
  CHECK_TEXT(scan.found, "");
  CHECK(!scan.too_deep);
}

TEST(scan_finds_an_initializer_in_an_external_file) {
  const std::string model = Model(ReluGraph(GraphInitializer(ExternalTensor("secret_w", "secret.txt"))));
  CHECK_TEXT(ScanFileReferences(model, kNoShared).found, "tensor 'secret_w' keeps its data in external file 'secret.txt'");
}

TEST(scan_finds_data_location_external_without_a_location) {
  const std::string tensor = Tensor("w2", kFloat) + Int(14, 1);  // data_location: EXTERNAL, no entries
  CHECK_TEXT(ScanFileReferences(Model(ReluGraph(GraphInitializer(tensor))), kNoShared).found,
             "tensor 'w2' keeps its data in external file '?'");
}

TEST(scan_finds_an_external_tensor_inside_a_subgraph) {
  const std::string branch = GraphInitializer(ExternalTensor("deep", "/etc/passwd"));
  const std::string model = Model(GraphWithBranch(branch));
  CHECK_TEXT(ScanFileReferences(model, kNoShared).found, "tensor 'deep' keeps its data in external file '/etc/passwd'");
}

TEST(scan_lets_shared_weight_placeholders_through_only_in_the_main_graph) {
  const std::vector<std::string> shared = {"shared_w"};
  const std::string placeholder = GraphInitializer(ExternalTensor("shared_w", kOuterConstant));
  CHECK_TEXT(ScanFileReferences(Model(ReluGraph(placeholder)), shared).found, "");
  // not declared shared, or declared but in a subgraph: a reference like any other
  CHECK(!ScanFileReferences(Model(ReluGraph(placeholder)), kNoShared).found.empty());
  CHECK(!ScanFileReferences(Model(GraphWithBranch(placeholder)), shared).found.empty());
  // declared shared but naming a real file: refused
  const std::string file = GraphInitializer(ExternalTensor("shared_w", "weights.bin"));
  CHECK(!ScanFileReferences(Model(ReluGraph(file)), shared).found.empty());
}

TEST(scan_refuses_nesting_past_protobufs_limit) {
  std::string graph = ReluGraph();
  for (int level = 0; level < 40; ++level) graph = GraphWithBranch(graph);  // graph, node, attribute: 3 per level
  const FileReferenceScan deep = ScanFileReferences(Model(graph), kNoShared);
  CHECK(deep.too_deep);
  std::string shallow = ReluGraph();
  for (int level = 0; level < 30; ++level) shallow = GraphWithBranch(shallow);  // 92 messages deep
  CHECK(!ScanFileReferences(Model(shallow), kNoShared).too_deep);
}

TEST(scan_survives_every_truncation_of_a_body) {
  const std::string model = Model(GraphWithBranch(GraphInitializer(ExternalTensor("deep", "secret.txt"))));
  for (size_t size = 0; size < model.size(); ++size) {
    const std::string cut = model.substr(0, size);  // its own allocation: ASan sees any overread
    const FileReferenceScan scan = ScanFileReferences(cut, kNoShared);
    CHECK(scan.found.empty() || scan.found.rfind("tensor '", 0) == 0);
    CHECK(!scan.too_deep);
  }
  CHECK(!ScanFileReferences(model, kNoShared).found.empty());
}

TEST(scan_gives_up_quietly_on_hostile_bytes) {
  const std::vector<std::string> hostile = {
      Varint(7 << 3 | 2) + Varint(1000) + "short",          // a length past the end
      Varint(7 << 3 | 2) + Varint(UINT64_MAX),              // a length no buffer has
      std::string(11, '\xFF'),                              // a varint that never ends
      Varint(7 << 3 | 3) + "group",                         // wire type 3 (groups)
      Varint(7 << 3 | 7),                                   // wire type 7 (invalid)
      Varint(1 << 3 | 1) + "1234567",                       // a fixed64 one byte short
      Varint(1 << 3 | 5) + "123",                           // a fixed32 one byte short
  };
  for (const std::string& bytes : hostile) {
    const FileReferenceScan scan = ScanFileReferences(bytes, kNoShared);
    CHECK_TEXT(scan.found, "");
    CHECK(!scan.too_deep);
  }
}

TEST(varint_reader_decodes_and_stops_at_the_end) {
  const std::string encoded = Varint(300) + Varint(0) + Varint(UINT64_MAX);
  const char* p = encoded.data();
  const char* end = p + encoded.size();
  uint64_t value = 0;
  CHECK(onnxmlu::ReadVarint(p, end, value) && value == 300);
  CHECK(onnxmlu::ReadVarint(p, end, value) && value == 0);
  CHECK(onnxmlu::ReadVarint(p, end, value) && value == UINT64_MAX);
  CHECK(p == end);
  CHECK(!onnxmlu::ReadVarint(p, end, value));  // nothing left
  const std::string truncated = "\xAC";         // 300's first byte alone
  const char* q = truncated.data();
  CHECK(!onnxmlu::ReadVarint(q, q + 1, value));
}

TEST(for_each_field_visits_fields_in_order_and_flags_bad_bytes) {
  const std::string message = Int(1, 5) + Bytes(2, "ab") + Varint(3 << 3 | 5) + "wxyz" + Int(4, 9);
  std::string seen;
  const bool ok = onnxmlu::ForEachField(message, [&](uint64_t field, uint64_t wire, uint64_t value, std::string_view payload) {
    seen += std::to_string(field) + ":" + std::to_string(wire) + ":" + std::to_string(value) + ":" + std::string(payload) + " ";
  });
  CHECK(ok);
  CHECK_TEXT(seen, "1:0:5: 2:2:2:ab 3:5:0: 4:0:9: ");
  CHECK(!onnxmlu::ForEachField(message.substr(0, message.size() - 1), [](auto...) {}));
}

}  // namespace
