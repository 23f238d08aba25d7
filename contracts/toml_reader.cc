#include "contracts/toml_reader.h"

#include <cmath>
#include <sstream>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "contracts/toml_guard.h"

namespace trainsup {

absl::StatusOr<toml::table> ParseTomlText(absl::string_view text) {
  if (absl::Status s = CheckTomlCharacters(text); !s.ok()) return s;
  try {
    return toml::parse(std::string_view(text.data(), text.size()));
  } catch (const toml::parse_error& e) {
    std::ostringstream where;
    where << e.source().begin;  // "line L, column C"
    return absl::InvalidArgumentError(
        absl::StrCat("not valid TOML at ", where.str(), ": ", std::string(e.description())));
  }
}

TomlFieldReader::TomlFieldReader(const toml::table* table, std::string prefix)
    : table_(table), prefix_(std::move(prefix)) {}

const toml::node* TomlFieldReader::Get(const std::string& key) {
  seen_.insert(key);
  if (table_ == nullptr) return nullptr;
  return table_->get(key);
}

absl::Status TomlFieldReader::Int(const std::string& key, int64_t* out, int64_t lo, int64_t hi) {
  const toml::node* node = Get(key);
  if (node == nullptr) return absl::OkStatus();
  const auto* v = node->as_integer();
  if (v == nullptr) return Error(key, "must be an integer");
  const int64_t value = v->get();
  if (value < lo || value > hi) {
    return Error(key, absl::StrCat("must be in [", lo, ", ", hi, "], got ", value));
  }
  *out = value;
  return absl::OkStatus();
}

absl::Status TomlFieldReader::Double(const std::string& key, double* out, double lo, double hi,
                                     bool lo_open, bool hi_open) {
  const toml::node* node = Get(key);
  if (node == nullptr) return absl::OkStatus();
  double value;
  if (const auto* f = node->as_floating_point()) {
    value = f->get();
  } else if (const auto* i = node->as_integer()) {
    value = static_cast<double>(i->get());
  } else {
    return Error(key, "must be a number");
  }
  const bool below = lo_open ? !(value > lo) : !(value >= lo);
  const bool above = hi_open ? !(value < hi) : !(value <= hi);
  if (!std::isfinite(value) || below || above) {
    return Error(key, absl::StrCat("must be in ", lo_open ? "(" : "[", lo, ", ", hi,
                                   hi_open ? ")" : "]", ", got ", value));
  }
  *out = value;
  return absl::OkStatus();
}

absl::Status TomlFieldReader::Bool(const std::string& key, bool* out) {
  const toml::node* node = Get(key);
  if (node == nullptr) return absl::OkStatus();
  const auto* v = node->as_boolean();
  if (v == nullptr) return Error(key, "must be true or false");
  *out = v->get();
  return absl::OkStatus();
}

absl::Status TomlFieldReader::String(const std::string& key, std::string* out,
                                     std::initializer_list<const char*> allowed) {
  const toml::node* node = Get(key);
  if (node == nullptr) return absl::OkStatus();
  const auto* v = node->as_string();
  if (v == nullptr) return Error(key, "must be a string");
  std::string value = v->get();
  if (value.size() > 4096) return Error(key, "longer than 4096 bytes");
  if (allowed.size() > 0) {
    bool ok = false;
    for (const char* a : allowed) ok = ok || value == a;
    if (!ok) {
      return Error(key, absl::StrCat("must be one of ", absl::StrJoin(allowed, ", "), "; got \"",
                                     value, "\""));
    }
  }
  *out = std::move(value);
  return absl::OkStatus();
}

absl::Status TomlFieldReader::Strings(const std::string& key, const toml::array& array,
                                      bool non_empty, std::vector<std::string>* out) const {
  std::vector<std::string> values;
  for (size_t i = 0; i < array.size(); ++i) {
    const std::string entry = absl::StrCat(key, "[", i, "]");
    const auto* v = array.get(i)->as_string();
    if (v == nullptr) return Error(entry, "must be a string");
    std::string value = v->get();
    if (absl::Status s = CheckText(entry, value); !s.ok()) return s;
    if (non_empty && value.empty()) return Error(entry, "must not be empty");
    values.push_back(std::move(value));
  }
  *out = std::move(values);
  return absl::OkStatus();
}

absl::Status TomlFieldReader::StringList(const std::string& key, std::vector<std::string>* out) {
  const toml::node* node = Get(key);
  if (node == nullptr) return absl::OkStatus();
  const auto* array = node->as_array();
  if (array == nullptr) return Error(key, "must be an array of strings");
  return Strings(key, *array, /*non_empty=*/false, out);
}

absl::Status TomlFieldReader::StringArray(const std::string& key, std::vector<std::string>* out,
                                          size_t max_entries) {
  const toml::node* node = Get(key);
  if (node == nullptr) return absl::OkStatus();
  const auto* array = node->as_array();
  if (array == nullptr) return Error(key, "must be an array of strings");
  if (array->empty() || array->size() > max_entries) {
    return Error(key,
                 absl::StrCat("must have 1 to ", max_entries, " entries, got ", array->size()));
  }
  return Strings(key, *array, /*non_empty=*/true, out);
}

absl::Status TomlFieldReader::StringTable(
    const std::string& key, std::map<std::string, std::string>* out,
    const std::function<std::string(const std::string&)>& check_name) {
  const toml::node* node = Get(key);
  if (node == nullptr) return absl::OkStatus();
  const auto* table = node->as_table();
  if (table == nullptr) return Error(key, "must be a table of strings");
  std::map<std::string, std::string> values;
  for (const auto& [name_key, value_node] : *table) {
    const std::string name(name_key.str());
    const std::string entry = absl::StrCat(key, ".", name);
    if (std::string why = check_name(name); !why.empty()) return Error(entry, why);
    const auto* v = value_node.as_string();
    if (v == nullptr) return Error(entry, "must be a string");
    std::string value = v->get();
    if (absl::Status s = CheckText(entry, value); !s.ok()) return s;
    values[name] = std::move(value);
  }
  *out = std::move(values);
  return absl::OkStatus();
}

absl::StatusOr<const toml::table*> TomlFieldReader::Table(const std::string& key) {
  const toml::node* node = Get(key);
  if (node == nullptr) return nullptr;
  const auto* t = node->as_table();
  if (t == nullptr) return Error(key, "must be a table");
  return t;
}

absl::Status TomlFieldReader::Finish() const {
  if (table_ == nullptr) return absl::OkStatus();
  for (const auto& [key, node] : *table_) {
    const std::string name(key.str());
    if (seen_.count(name) == 0) return Error(name, "unknown key");
  }
  return absl::OkStatus();
}

std::string TomlFieldReader::Path(const std::string& key) const {
  return prefix_.empty() ? key : absl::StrCat(prefix_, ".", key);
}

absl::Status TomlFieldReader::Error(const std::string& key, const std::string& what) const {
  return absl::InvalidArgumentError(absl::StrCat(Path(key), ": ", what));
}

absl::Status TomlFieldReader::CheckText(const std::string& key, const std::string& value) const {
  if (value.size() > 4096) return Error(key, "longer than 4096 bytes");
  if (value.find('\0') != std::string::npos) return Error(key, "must not contain NUL");
  return absl::OkStatus();
}

}  // namespace trainsup
