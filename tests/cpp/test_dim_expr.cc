// dim_expr.h: output dims as polynomials over the input dims, parsed from the body metadata and
// evaluated at run time; malformed or implausible text is refused (the kernel then copies).
#include <optional>
#include <string>
#include <vector>

#include "check.h"
#include "dim_expr.h"

namespace {

using onnxmlu::EvaluateDim;
using onnxmlu::ParseOutputDims;

using Shapes = std::vector<std::vector<int64_t>>;

// The value of the only output's dim `axis` of `text` (one output) at `shapes`.
std::optional<int64_t> Eval(const char* text, const Shapes& shapes, size_t axis = 0) {
  auto parsed = ParseOutputDims(text, 1, shapes.size());
  if (!parsed || !(*parsed)[0] || axis >= (*parsed)[0]->size()) return std::nullopt;
  return EvaluateDim((*(*parsed)[0])[axis], shapes);
}

TEST(dim_expr_literals_references_and_sums) {
  const Shapes kv = {{1, 3, 512}, {1, 2, 16, 64}};  // new tokens [B, S, H], past [B, KV, P, D]
  CHECK(Eval("i0.0,2,i1.2+i0.1,64", kv, 0) == 1);
  CHECK(Eval("i0.0,2,i1.2+i0.1,64", kv, 1) == 2);
  CHECK(Eval("i0.0,2,i1.2+i0.1,64", kv, 2) == 19);
  CHECK(Eval("i0.0,2,i1.2+i0.1,64", kv, 3) == 64);
  CHECK(Eval("i1.2+1", kv) == 17);
  CHECK(Eval("i1.2-1", kv) == 15);
}

TEST(dim_expr_products_and_parentheses) {
  const Shapes shapes = {{2, 3, 8, 5}};
  CHECK(Eval("i0.1*i0.3", shapes) == 15);       // heads merged: H * D
  CHECK(Eval("2*i0.2+1", shapes) == 17);
  CHECK(Eval("2*(i0.2+1)", shapes) == 18);
  CHECK(Eval("(i0.0+1)*(i0.1-1)", shapes) == 6);
  CHECK(Eval("i0.0*i0.1*i0.2-i0.3", shapes) == 43);
}

TEST(dim_expr_outputs_unknown_and_rank_zero) {
  auto parsed = ParseOutputDims("?;;i0.0", 3, 1);
  CHECK(parsed.has_value());
  if (!parsed) return;
  CHECK(!(*parsed)[0].has_value());
  CHECK((*parsed)[1].has_value() && (*parsed)[1]->empty());
  CHECK((*parsed)[2].has_value() && (*parsed)[2]->size() == 1);
}

TEST(dim_expr_malformed_text_is_refused) {
  for (const char* text : {"i0", "i0.", "i.1", "x", "1+", "+1", "(1", "1)", "1,,2", "i0.0 + 1", "1**2", "-1",
                           "1234567890123456789", "i5.0"}) {
    if (ParseOutputDims(text, 1, 2).has_value()) onnxmlu_tests::Fail(__FILE__, __LINE__, text);
  }
  CHECK(!ParseOutputDims("1;2", 1, 0).has_value());   // two outputs where the body has one
  CHECK(!ParseOutputDims("1", 2, 0).has_value());
  std::string deep(40, '(');
  deep += "1" + std::string(40, ')');
  CHECK(!ParseOutputDims(deep, 1, 0).has_value());   // nesting beyond any real dim
}

TEST(dim_expr_evaluation_refuses_what_it_cannot_compute) {
  CHECK(!Eval("i0.5", {{1, 2}}).has_value());                                  // an axis the input lacks
  CHECK(!Eval("i0.0-3", {{2}}).has_value());                                   // negative
  CHECK(!Eval("i0.0*i0.0*i0.0", {{int64_t{1} << 30}}).has_value());            // overflow
  CHECK(!Eval("999999999999999999*999999999999999999", {}).has_value());      // overflow at parse
}

}  // namespace
