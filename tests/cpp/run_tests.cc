// Runs every TEST of the unit-test binary (built by custom_ops/CMakeLists.txt with
// -DONNXMLU_BUILD_TESTS=ON; `make test` and `make sanitize` run it). Optional argument: the label
// rule's case file (default: tests/data/label_rule_cases.json of this source tree).
#include <cstdio>

#include "check.h"

int main(int argc, char** argv) {
  if (argc > 1) onnxmlu_tests::LabelCasesPath() = argv[1];
  for (const auto& test : onnxmlu_tests::Tests()) {
    const int before = onnxmlu_tests::Failures();
    test.run();
    if (onnxmlu_tests::Failures() != before) std::fprintf(stderr, "FAILED %s\n", test.name);
  }
  const size_t count = onnxmlu_tests::Tests().size();
  if (onnxmlu_tests::Failures() != 0) {
    std::fprintf(stderr, "onnxmlu_ops_tests: %d checks failed in %zu tests\n", onnxmlu_tests::Failures(), count);
    return 1;
  }
  std::printf("onnxmlu_ops_tests: %zu tests passed\n", count);
  return 0;
}
