#include "contracts/toml_guard.h"

#include <cstdint>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainsup {
namespace {

bool IsAscii(unsigned char c) { return c < 0x80; }

bool IsBlankOrBreak(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

// "U+00E9" for the UTF-8 sequence at text[at], or "byte 0xC3" when it is
// not one.
std::string DescribeCharacter(absl::string_view text, size_t at) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(text[at + k]); };
  const unsigned char lead = b(0);
  const int length = lead >= 0xF0 && lead < 0xF8   ? 4
                     : lead >= 0xE0 && lead < 0xF0 ? 3
                     : lead >= 0xC0 && lead < 0xE0 ? 2
                                                   : 0;
  if (length == 0 || at + length > text.size()) return absl::StrFormat("byte 0x%02X", lead);
  uint32_t code = lead & (0x7F >> length);
  for (int k = 1; k < length; ++k) {
    if ((b(k) & 0xC0) != 0x80) return absl::StrFormat("byte 0x%02X", lead);
    code = (code << 6) | (b(k) & 0x3F);
  }
  return absl::StrFormat("U+%04X", code);
}

absl::Status Refuse(absl::string_view text, size_t at, absl::string_view where) {
  int64_t line = 1, column = 1;
  for (size_t i = 0; i < at; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      ++line;
      column = 1;
    } else if ((c & 0xC0) != 0x80) {  // a code point starts here
      ++column;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("non-ASCII character ",
                                                 DescribeCharacter(text, at), " at line ", line,
                                                 ", column ", column, " ", where));
}

// How many times `quote` repeats from text[at].
size_t Run(absl::string_view text, size_t at, char quote) {
  size_t n = 0;
  while (at + n < text.size() && text[at + n] == quote) ++n;
  return n;
}

enum class Mode { kBare, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral };
enum class Open { kHeader, kArray, kInlineTable };

constexpr absl::string_view kOutside =
    "outside a string or comment (TOML allows non-ASCII characters only in quoted strings and "
    "comments)";

// One pass over the text, in the mode toml++ would be in at each character.
class Scanner {
 public:
  explicit Scanner(absl::string_view text)
      : text_(text), i_(absl::StartsWith(text, "\xEF\xBB\xBF") ? 3 : 0) {}

  absl::Status Scan() {
    while (i_ < text_.size()) {
      if (absl::Status s = Step(); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Step() {
    switch (mode_) {
      case Mode::kComment:
        Comment();
        return absl::OkStatus();
      case Mode::kBasic:
      case Mode::kLiteral:
        SingleLineString();
        return absl::OkStatus();
      case Mode::kMultiBasic:
      case Mode::kMultiLiteral:
        return MultiLineString();
      case Mode::kBare:
        break;
    }
    const char c = text_[i_];
    if (!IsAscii(static_cast<unsigned char>(c))) return Refuse(text_, i_, kOutside);
    ++i_;
    Bare(c);
    return absl::OkStatus();
  }

  void LineBreak() {
    if (open_.empty() || open_.back() == Open::kHeader) {
      open_.clear();
      token_start_ = true;
      in_key_ = true;
    }
  }

  void Comment() {
    if (text_[i_] == '\n') {
      mode_ = Mode::kBare;
      LineBreak();
    }
    ++i_;
  }

  void SingleLineString() {
    const char c = text_[i_];
    const char quote = mode_ == Mode::kBasic ? '"' : '\'';
    if (mode_ == Mode::kBasic && c == '\\' && i_ + 1 < text_.size() && text_[i_ + 1] != '\n') {
      i_ += 2;
      return;
    }
    if (c == quote || c == '\n') {  // a line break ends it too (toml++ stops there)
      mode_ = Mode::kBare;
      token_start_ = false;
      if (c == '\n') LineBreak();
    }
    ++i_;
  }

  absl::Status MultiLineString() {
    const char c = text_[i_];
    const char quote = mode_ == Mode::kMultiBasic ? '"' : '\'';
    if (mode_ == Mode::kMultiBasic && c == '\\') return AfterBackslash();
    if (c == quote) {
      const size_t run = Run(text_, i_, quote);
      if (run >= 3) {  // the end; up to two more quotes are content
        i_ += std::min<size_t>(run, 5);
        mode_ = Mode::kBare;
        token_start_ = false;
      } else {
        i_ += run;
      }
      return absl::OkStatus();
    }
    ++i_;
    return absl::OkStatus();
  }

  // A backslash in a multi-line basic string: toml++ tests the next
  // character, and after a line-ending backslash the first one past the
  // blanks and breaks, for whitespace.
  absl::Status AfterBackslash() {
    size_t j = i_ + 1;
    if (j < text_.size() && !IsAscii(static_cast<unsigned char>(text_[j]))) {
      return Refuse(text_, j, "after a backslash");
    }
    if (j < text_.size() && IsBlankOrBreak(text_[j])) {
      while (j < text_.size() && IsBlankOrBreak(text_[j])) ++j;
      if (j < text_.size() && !IsAscii(static_cast<unsigned char>(text_[j]))) {
        return Refuse(text_, j,
                      "after a line-ending backslash (begin the continued line with an "
                      "escape such as \\u00E9 instead)");
      }
      i_ = j;
    } else {
      i_ = j + 1;
    }
    return absl::OkStatus();
  }

  // An ASCII character outside strings and comments, already consumed.
  void Bare(char c) {
    switch (c) {
      case ' ':
      case '\t':
      case '\r':
        break;
      case '\n':
        LineBreak();
        break;
      case '#':
        mode_ = Mode::kComment;
        break;
      case '"':
      case '\'':
        Quote(c);
        break;
      case '[':
        OpenBracket();
        break;
      case ']':
        CloseBracket();
        break;
      case '{':
        if (token_start_ && !in_key_) {
          open_.push_back(Open::kInlineTable);
          in_key_ = true;
        } else {
          token_start_ = false;
        }
        break;
      case '}':
        if (!open_.empty() && open_.back() == Open::kInlineTable) open_.pop_back();
        token_start_ = false;
        in_key_ = false;
        break;
      case ',':
        token_start_ = !open_.empty() && open_.back() != Open::kHeader;
        in_key_ = token_start_ && open_.back() == Open::kInlineTable;
        break;
      case '=':
        token_start_ = in_key_ && (open_.empty() || open_.back() == Open::kInlineTable);
        if (token_start_) in_key_ = false;
        break;
      case '.':
        token_start_ = in_key_;  // in a value it is part of a number or a time
        break;
      default:
        token_start_ = false;
        break;
    }
  }

  void Quote(char c) {
    if (!token_start_) return;  // toml++ fails here or reads on: not a string
    const size_t run = 1 + Run(text_, i_, c);
    if (run >= 3) {
      mode_ = c == '"' ? Mode::kMultiBasic : Mode::kMultiLiteral;
      i_ += 2;
    } else if (run == 2) {  // an empty string
      i_ += 1;
      token_start_ = false;
    } else {
      mode_ = c == '"' ? Mode::kBasic : Mode::kLiteral;
    }
  }

  void OpenBracket() {
    if (open_.empty() && in_key_ && token_start_) {  // [table] or [[array of tables]]
      open_.push_back(Open::kHeader);
      if (i_ < text_.size() && text_[i_] == '[') ++i_;
    } else if (token_start_ && !in_key_) {
      open_.push_back(Open::kArray);
    } else {
      token_start_ = false;
    }
  }

  void CloseBracket() {
    if (!open_.empty() && open_.back() != Open::kInlineTable) {
      if (open_.back() == Open::kHeader && i_ < text_.size() && text_[i_] == ']') ++i_;
      in_key_ = open_.back() == Open::kHeader ? false : in_key_;
      open_.pop_back();
    }
    token_start_ = false;
  }

  absl::string_view text_;
  size_t i_;
  Mode mode_ = Mode::kBare;
  std::vector<Open> open_;
  // Whether a key segment or a value may begin at the next non-blank
  // character (there a quote starts a string), and whether that is a key.
  bool token_start_ = true;
  bool in_key_ = true;
};

}  // namespace

absl::Status CheckTomlCharacters(absl::string_view text) { return Scanner(text).Scan(); }

}  // namespace trainsup
