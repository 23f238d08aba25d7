#include "checkpoint/manifest.h"

#include <xxhash.h>

#include <algorithm>
#include <ctime>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace trainsup::ckpt {

std::string Manifest::ToJson() const {
  nlohmann::json j;
  j["format"] = "trainsup-checkpoint";
  j["format_version"] = format_version;
  j["step"] = step;
  j["created"] = created;
  j["files"] = nlohmann::json::array();
  for (const auto& f : files) {
    j["files"].push_back({{"name", f.name}, {"size", f.size}, {"xxh3_128", f.xxh3_128}});
  }
  return j.dump(2) + "\n";
}

namespace {

using Json = nlohmann::json;

absl::Status Malformed(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("manifest ", what));
}

// The integer `j[name]` in [lo, hi], read in its full width: a number is
// never narrowed into its field (2^32 + 1 is not version 1).
absl::StatusOr<int64_t> IntegerField(const Json& j, const std::string& where, const char* name,
                                     int64_t lo, int64_t hi) {
  const auto it = j.find(name);
  if (it == j.end()) return Malformed(absl::StrCat(where, "has no '", name, "'"));
  int64_t v = 0;
  bool fits = false;
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    v = static_cast<int64_t>(u);
    fits = u <= static_cast<uint64_t>(hi) && v >= lo;
  } else if (it->is_number_integer()) {
    v = it->get<int64_t>();
    fits = v >= lo && v <= hi;
  } else {
    return Malformed(absl::StrCat(where, "field '", name, "' is not an integer"));
  }
  if (!fits) {
    return Malformed(absl::StrCat(where, "field '", name, "' is ", it->dump(), ", outside [", lo,
                                  ", ", hi, "]"));
  }
  return v;
}

absl::StatusOr<std::string> StringField(const Json& j, const std::string& where, const char* name) {
  const auto it = j.find(name);
  if (it == j.end()) return Malformed(absl::StrCat(where, "has no '", name, "'"));
  if (!it->is_string()) return Malformed(absl::StrCat(where, "field '", name, "' is not a string"));
  return it->get<std::string>();
}

bool IsLowerHex(const std::string& s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

absl::StatusOr<ManifestEntry> ReadEntry(const Json& f, size_t index) {
  const std::string where = absl::StrCat("file entry ", index, " ");
  if (!f.is_object()) return Malformed(absl::StrCat(where, "is not an object"));
  ManifestEntry e;
  absl::StatusOr<std::string> name = StringField(f, where, "name");
  if (!name.ok()) return name.status();
  e.name = *std::move(name);
  if (e.name.empty() || e.name.find('/') != std::string::npos || e.name == "." || e.name == ".." ||
      e.name == kManifestName) {
    return Malformed(absl::StrCat("names an invalid file '", e.name, "'"));
  }
  const auto size = f.find("size");
  if (size == f.end()) return Malformed(absl::StrCat(where, "has no 'size'"));
  if (!size->is_number_unsigned()) {
    return Malformed(
        absl::StrCat(where, "field 'size' is ", size->dump(), ", not an integer in [0, 2^64)"));
  }
  e.size = size->get<uint64_t>();
  absl::StatusOr<std::string> hash = StringField(f, where, "xxh3_128");
  if (!hash.ok()) return hash.status();
  if (hash->size() != 32 || !IsLowerHex(*hash)) {
    return Malformed(absl::StrCat(where, "field 'xxh3_128' is not 32 lower-case hex digits"));
  }
  e.xxh3_128 = *std::move(hash);
  return e;
}

}  // namespace

absl::StatusOr<Manifest> Manifest::FromJson(std::string_view text) {
  const Json j = Json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Malformed("is not a JSON object");
  absl::StatusOr<std::string> format = StringField(j, "", "format");
  if (!format.ok()) return format.status();
  if (*format != "trainsup-checkpoint") return Malformed("'format' is not trainsup-checkpoint");
  Manifest m;
  absl::StatusOr<int64_t> version =
      IntegerField(j, "", "format_version", 1, std::numeric_limits<int>::max());
  if (!version.ok()) return version.status();
  m.format_version = static_cast<int>(*version);
  absl::StatusOr<int64_t> step =
      IntegerField(j, "", "step", 0, std::numeric_limits<int64_t>::max());
  if (!step.ok()) return step.status();
  m.step = *step;
  absl::StatusOr<std::string> created = StringField(j, "", "created");
  if (!created.ok()) return created.status();
  m.created = *std::move(created);
  const auto files = j.find("files");
  if (files == j.end()) return Malformed("has no 'files'");
  if (!files->is_array()) return Malformed("field 'files' is not an array");
  for (size_t i = 0; i < files->size(); ++i) {
    absl::StatusOr<ManifestEntry> e = ReadEntry((*files)[i], i);
    if (!e.ok()) return e.status();
    m.files.push_back(*std::move(e));
  }
  return m;
}

Hasher::Hasher() : state_(XXH3_createState()) {
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
}
Hasher::~Hasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Hasher::Update(std::string_view data) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data.data(), data.size());
}

std::string Hasher::HexDigest() const {
  XXH128_hash_t h = XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_));
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : c.digest) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

std::string NowRfc3339() {
  std::time_t t = std::time(nullptr);
  std::tm tm;
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace trainsup::ckpt
