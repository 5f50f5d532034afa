// A tiny test runner for the library's units (no third-party dependency): TEST(name) registers a
// function, CHECK(condition) records a failure with its line and carries on, main() in
// run_tests.cc runs every test and exits non-zero when any check failed.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace onnxmlu_tests {

struct Registered {
  const char* name;
  std::function<void()> run;
};

inline std::vector<Registered>& Tests() {
  static std::vector<Registered> tests;
  return tests;
}

inline int& Failures() {
  static int failures = 0;
  return failures;
}

struct Register {
  Register(const char* name, std::function<void()> run) { Tests().push_back({name, std::move(run)}); }
};

inline void Fail(const char* file, int line, const std::string& what) {
  ++Failures();
  std::fprintf(stderr, "%s:%d: check failed: %s\n", file, line, what.c_str());
}

// Path of the label rule's case file (run_tests.cc takes another from the command line).
inline std::string& LabelCasesPath() {
  static std::string path = ONNXMLU_LABEL_CASES;
  return path;
}

}  // namespace onnxmlu_tests

#define ONNXMLU_CAT2(a, b) a##b
#define ONNXMLU_CAT(a, b) ONNXMLU_CAT2(a, b)
#define TEST(name)                                                                      \
  static void name();                                                                   \
  static const onnxmlu_tests::Register ONNXMLU_CAT(register_, name)(#name, &name);      \
  static void name()
#define CHECK(condition) \
  ((condition) ? (void)0 : onnxmlu_tests::Fail(__FILE__, __LINE__, #condition))
// CHECK_EQ for values that print as std::string (the failure shows both sides).
#define CHECK_TEXT(actual, expected)                                                                   \
  do {                                                                                                 \
    const std::string a_ = (actual), e_ = (expected);                                                  \
    if (a_ != e_) onnxmlu_tests::Fail(__FILE__, __LINE__, #actual " == \"" + e_ + "\", got \"" + a_ + "\""); \
  } while (0)
