// Parser and evaluator of output-dim polynomials (see dim_expr.h for the grammar).
#include "dim_expr.h"

#include <utility>

namespace onnxmlu {

namespace {

// Bounds on what a plausible value holds: a body's dims are short sums of a few products.
constexpr size_t kMaxTerms = 64;
constexpr size_t kMaxFactors = 16;
constexpr size_t kMaxDepth = 16;
constexpr size_t kMaxIndex = 1u << 20;

bool Multiply(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }
bool Add(int64_t a, int64_t b, int64_t* out) { return !__builtin_add_overflow(a, b, out); }

// Recursive descent over one dim; every method returns false on malformed text or a bound hit.
class DimParser {
 public:
  DimParser(std::string_view text, size_t inputs) : text_(text), inputs_(inputs) {}

  bool Dim(DimPolynomial* out, size_t depth = 0) {
    if (depth > kMaxDepth || !Term(out, depth)) return false;
    while (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) {
      const bool minus = text_[pos_++] == '-';
      DimPolynomial next;
      if (!Term(&next, depth)) return false;
      for (DimTerm& term : next) {
        if (minus && !Multiply(term.coefficient, -1, &term.coefficient)) return false;
        out->push_back(std::move(term));
      }
      if (out->size() > kMaxTerms) return false;
    }
    return true;
  }

  bool AtEnd() const { return pos_ == text_.size(); }

 private:
  bool Term(DimPolynomial* out, size_t depth) {
    if (!Factor(out, depth)) return false;
    while (pos_ < text_.size() && text_[pos_] == '*') {
      ++pos_;
      DimPolynomial right, product;
      if (!Factor(&right, depth)) return false;
      for (const DimTerm& a : *out) {
        for (const DimTerm& b : right) {
          DimTerm term{0, a.factors};
          term.factors.insert(term.factors.end(), b.factors.begin(), b.factors.end());
          if (!Multiply(a.coefficient, b.coefficient, &term.coefficient) || term.factors.size() > kMaxFactors) return false;
          product.push_back(std::move(term));
        }
      }
      if (product.size() > kMaxTerms) return false;
      *out = std::move(product);
    }
    return true;
  }

  bool Factor(DimPolynomial* out, size_t depth) {
    if (pos_ >= text_.size()) return false;
    const char c = text_[pos_];
    if (c == '(') {
      ++pos_;
      if (!Dim(out, depth + 1) || pos_ >= text_.size() || text_[pos_] != ')') return false;
      ++pos_;
      return true;
    }
    if (c == 'i') {
      ++pos_;
      uint64_t input = 0, axis = 0;
      if (!Number(&input) || pos_ >= text_.size() || text_[pos_++] != '.' || !Number(&axis)) return false;
      if (input >= inputs_ || axis >= kMaxIndex) return false;
      out->push_back(DimTerm{1, {{static_cast<size_t>(input), static_cast<size_t>(axis)}}});
      return true;
    }
    uint64_t value = 0;
    if (!Number(&value)) return false;
    out->push_back(DimTerm{static_cast<int64_t>(value), {}});
    return true;
  }

  // Decimal digits, at most 18 of them (fits int64 with room to spare).
  bool Number(uint64_t* value) {
    const size_t start = pos_;
    *value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9' && pos_ - start < 18) {
      *value = *value * 10 + static_cast<uint64_t>(text_[pos_++] - '0');
    }
    return pos_ > start && (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9');
  }

  std::string_view text_;
  size_t inputs_;
  size_t pos_ = 0;
};

// The pieces of `text` between separators (an empty text is one empty piece).
std::vector<std::string_view> Split(std::string_view text, char separator) {
  std::vector<std::string_view> pieces;
  size_t start = 0;
  for (size_t at = text.find(separator); at != std::string_view::npos; at = text.find(separator, start)) {
    pieces.push_back(text.substr(start, at - start));
    start = at + 1;
  }
  pieces.push_back(text.substr(start));
  return pieces;
}

std::optional<OutputDims> ParseOutput(std::string_view text, size_t inputs) {
  if (text == "?") return OutputDims(std::nullopt);
  std::vector<DimPolynomial> dims;
  if (text.empty()) return OutputDims(std::move(dims));  // rank 0
  for (std::string_view piece : Split(text, ',')) {
    DimParser parser(piece, inputs);
    DimPolynomial dim;
    if (!parser.Dim(&dim) || !parser.AtEnd()) return std::nullopt;
    dims.push_back(std::move(dim));
  }
  return OutputDims(std::move(dims));
}

}  // namespace

std::optional<std::vector<OutputDims>> ParseOutputDims(std::string_view text, size_t outputs, size_t inputs) {
  const std::vector<std::string_view> pieces = Split(text, ';');
  if (pieces.size() != outputs) return std::nullopt;
  std::vector<OutputDims> parsed;
  for (std::string_view piece : pieces) {
    std::optional<OutputDims> output = ParseOutput(piece, inputs);
    if (!output) return std::nullopt;
    parsed.push_back(std::move(*output));
  }
  return parsed;
}

std::optional<int64_t> EvaluateDim(const DimPolynomial& dim, const std::vector<std::vector<int64_t>>& input_shapes) {
  int64_t sum = 0;
  for (const DimTerm& term : dim) {
    int64_t product = term.coefficient;
    for (const auto& [input, axis] : term.factors) {
      if (input >= input_shapes.size() || axis >= input_shapes[input].size()) return std::nullopt;
      if (!Multiply(product, input_shapes[input][axis], &product)) return std::nullopt;
    }
    if (!Add(sum, product, &sum)) return std::nullopt;
  }
  if (sum < 0) return std::nullopt;
  return sum;
}

}  // namespace onnxmlu
