// A minimal JSON reader for the tests' data files (objects, arrays, strings with the common
// escapes, integers, true/false/null): enough for tests/data/label_rule_cases.json, no
// third-party dependency. Malformed text throws std::runtime_error naming the offset.
#pragma once

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace onnxmlu_tests {

struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  bool boolean = false;
  long long number = 0;
  std::string text;
  std::vector<Json> items;
  std::map<std::string, Json> members;

  bool has(const std::string& key) const { return members.count(key) != 0; }
  const Json& operator[](const std::string& key) const {
    static const Json kAbsent;
    auto found = members.find(key);
    return found == members.end() ? kAbsent : found->second;
  }
};

class JsonReader {
 public:
  explicit JsonReader(const std::string& text) : text_(text) {}

  Json Document() {
    Json value = Value();
    Space();
    if (at_ != text_.size()) Fail("text after the document");
    return value;
  }

 private:
  [[noreturn]] void Fail(const std::string& what) const {
    throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(at_));
  }
  void Space() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\r' || text_[at_] == '\t')) ++at_;
  }
  char Peek() {
    Space();
    if (at_ >= text_.size()) Fail("unexpected end");
    return text_[at_];
  }
  void Expect(char c) {
    if (Peek() != c) Fail(std::string("expected '") + c + "'");
    ++at_;
  }
  bool Word(const char* word) {
    const std::string w(word);
    if (text_.compare(at_, w.size(), w) != 0) return false;
    at_ += w.size();
    return true;
  }

  Json Value() {
    const char c = Peek();
    Json value;
    if (c == '{') return Object();
    if (c == '[') return Array();
    if (c == '"') {
      value.kind = Json::kString;
      value.text = String();
    } else if (Word("true") || Word("false")) {
      value.kind = Json::kBool;
      value.boolean = text_[at_ - 1] == 'e' && text_[at_ - 2] == 'u';
    } else if (Word("null")) {
      value.kind = Json::kNull;
    } else {
      value.kind = Json::kNumber;
      size_t used = 0;
      try {
        value.number = std::stoll(text_.substr(at_, 24), &used);
      } catch (const std::exception&) {
        Fail("expected a value");
      }
      at_ += used;
    }
    return value;
  }

  std::string String() {
    Expect('"');
    std::string out;
    while (at_ < text_.size() && text_[at_] != '"') {
      char c = text_[at_++];
      if (c == '\\') {
        if (at_ >= text_.size()) Fail("unterminated escape");
        const char e = text_[at_++];
        c = e == 'n' ? '\n' : e == 't' ? '\t' : e;  // \" \\ \/ stand for themselves
        if (e == 'u') Fail("\\u escapes are not supported");
      }
      out += c;
    }
    Expect('"');
    return out;
  }

  Json Array() {
    Json value;
    value.kind = Json::kArray;
    Expect('[');
    if (Peek() == ']') return ++at_, value;
    do value.items.push_back(Value()); while (Peek() == ',' && ++at_);
    Expect(']');
    return value;
  }

  Json Object() {
    Json value;
    value.kind = Json::kObject;
    Expect('{');
    if (Peek() == '}') return ++at_, value;
    do {
      Peek();
      std::string key = String();
      Expect(':');
      value.members[key] = Value();
    } while (Peek() == ',' && ++at_);
    Expect('}');
    return value;
  }

  const std::string& text_;
  size_t at_ = 0;
};

}  // namespace onnxmlu_tests
