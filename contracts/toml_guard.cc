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

}  // namespace

absl::Status CheckTomlCharacters(absl::string_view text) {
  constexpr absl::string_view kOutside =
      "outside a string or comment (TOML allows non-ASCII characters only in quoted strings and "
      "comments)";
  size_t i = absl::StartsWith(text, "\xEF\xBB\xBF") ? 3 : 0;
  Mode mode = Mode::kBare;
  std::vector<Open> open;
  // Whether a key segment or a value may begin at the next non-blank
  // character (there a quote starts a string), and whether that is a key.
  bool token_start = true;
  bool in_key = true;
  const auto line_break = [&] {
    if (open.empty() || open.back() == Open::kHeader) {
      open.clear();
      token_start = true;
      in_key = true;
    }
  };
  while (i < text.size()) {
    const char c = text[i];
    const unsigned char u = static_cast<unsigned char>(c);
    switch (mode) {
      case Mode::kComment:
        if (c == '\n') {
          mode = Mode::kBare;
          line_break();
        }
        ++i;
        continue;
      case Mode::kBasic:
      case Mode::kLiteral: {
        const char quote = mode == Mode::kBasic ? '"' : '\'';
        if (mode == Mode::kBasic && c == '\\' && i + 1 < text.size() && text[i + 1] != '\n') {
          i += 2;
          continue;
        }
        if (c == quote || c == '\n') {  // a line break ends it too (toml++ stops there)
          mode = Mode::kBare;
          token_start = false;
          if (c == '\n') line_break();
        }
        ++i;
        continue;
      }
      case Mode::kMultiBasic:
      case Mode::kMultiLiteral: {
        const char quote = mode == Mode::kMultiBasic ? '"' : '\'';
        if (mode == Mode::kMultiBasic && c == '\\') {
          size_t j = i + 1;
          if (j < text.size() && !IsAscii(static_cast<unsigned char>(text[j]))) {
            return Refuse(text, j, "after a backslash");
          }
          if (j < text.size() && IsBlankOrBreak(text[j])) {
            while (j < text.size() && IsBlankOrBreak(text[j])) ++j;
            if (j < text.size() && !IsAscii(static_cast<unsigned char>(text[j]))) {
              return Refuse(text, j,
                            "after a line-ending backslash (begin the continued line with an "
                            "escape such as \\u00E9 instead)");
            }
            i = j;
          } else {
            i = j + 1;
          }
          continue;
        }
        if (c == quote) {
          const size_t run = Run(text, i, quote);
          if (run >= 3) {  // the end; up to two more quotes are content
            i += std::min<size_t>(run, 5);
            mode = Mode::kBare;
            token_start = false;
          } else {
            i += run;
          }
          continue;
        }
        ++i;
        continue;
      }
      case Mode::kBare:
        break;
    }
    if (!IsAscii(u)) return Refuse(text, i, kOutside);
    ++i;
    switch (c) {
      case ' ':
      case '\t':
      case '\r':
        break;
      case '\n':
        line_break();
        break;
      case '#':
        mode = Mode::kComment;
        break;
      case '"':
      case '\'': {
        if (!token_start) break;  // toml++ fails here or reads on: not a string
        const size_t run = 1 + Run(text, i, c);
        if (run >= 3) {
          mode = c == '"' ? Mode::kMultiBasic : Mode::kMultiLiteral;
          i += 2;
        } else if (run == 2) {  // an empty string
          i += 1;
          token_start = false;
        } else {
          mode = c == '"' ? Mode::kBasic : Mode::kLiteral;
        }
        break;
      }
      case '[':
        if (open.empty() && in_key && token_start) {  // [table] or [[array of tables]]
          open.push_back(Open::kHeader);
          if (i < text.size() && text[i] == '[') ++i;
        } else if (token_start && !in_key) {
          open.push_back(Open::kArray);
        } else {
          token_start = false;
        }
        break;
      case ']':
        if (!open.empty() && open.back() != Open::kInlineTable) {
          if (open.back() == Open::kHeader && i < text.size() && text[i] == ']') ++i;
          in_key = open.back() == Open::kHeader ? false : in_key;
          open.pop_back();
        }
        token_start = false;
        break;
      case '{':
        if (token_start && !in_key) {
          open.push_back(Open::kInlineTable);
          in_key = true;
        } else {
          token_start = false;
        }
        break;
      case '}':
        if (!open.empty() && open.back() == Open::kInlineTable) open.pop_back();
        token_start = false;
        in_key = false;
        break;
      case ',':
        token_start = !open.empty() && open.back() != Open::kHeader;
        in_key = token_start && open.back() == Open::kInlineTable;
        break;
      case '=':
        token_start = in_key && (open.empty() || open.back() == Open::kInlineTable);
        if (token_start) in_key = false;
        break;
      case '.':
        token_start = in_key;  // in a value it is part of a number or a time
        break;
      default:
        token_start = false;
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace trainsup
