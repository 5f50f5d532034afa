// Output dims as functions of the input dims: the body metadata kOutputDimsKey, parsed and
// evaluated (free of onnxruntime, so tests/cpp links it alone).
//
// The value (written by onnxmlu/collapse/dims.py) lists the body's outputs in order, separated by
// ';'. An output is '?' (its shape is not known before the run) or its dims separated by ','
// (nothing for a rank-0 output). A dim is a polynomial over the input dims with integer
// coefficients, written without spaces:
//
//   dim    := term (('+' | '-') term)*
//   term   := factor ('*' factor)*
//   factor := digits | 'i' digits '.' digits | '(' dim ')'
//
// where `i<k>.<d>` is axis d of body input k; e.g. `i0.0,2,i1.2+i0.1,64` is the shape of a KV
// cache that concatenates a past (input 1) with the new tokens (input 0's axis 1). A parsed dim
// is kept as a sum of products (parentheses multiplied out), evaluated with overflow checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace onnxmlu {

// One term of a polynomial: coefficient times the product of the input dims it names.
struct DimTerm {
  int64_t coefficient = 0;
  std::vector<std::pair<size_t, size_t>> factors;  // (input index, axis), each a factor
};
using DimPolynomial = std::vector<DimTerm>;
// One output: its dims, or nullopt where the value says '?'.
using OutputDims = std::optional<std::vector<DimPolynomial>>;

// The outputs of a kOutputDimsKey value; nullopt when the text is malformed, lists another
// number of outputs than `outputs`, names an input >= `inputs`, or is too large to be plausible.
std::optional<std::vector<OutputDims>> ParseOutputDims(std::string_view text, size_t outputs, size_t inputs);

// The value of a dim at the given input shapes; nullopt when it names an axis an input lacks,
// overflows int64, or is negative.
std::optional<int64_t> EvaluateDim(const DimPolynomial& dim, const std::vector<std::vector<int64_t>>& input_shapes);

}  // namespace onnxmlu
