#include "checkpoint/manifest.h"

#include <xxhash.h>

#include <ctime>

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

absl::StatusOr<Manifest> Manifest::FromJson(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("manifest is not a JSON object");
  }
  auto field = [&](const char* name, nlohmann::json::value_t type) -> absl::Status {
    if (!j.contains(name)) return absl::InvalidArgumentError(absl::StrCat("manifest has no '", name, "'"));
    const auto t = j[name].type();
    const bool ok = t == type || (type == nlohmann::json::value_t::number_integer &&
                                  t == nlohmann::json::value_t::number_unsigned);
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("manifest field '", name, "' has the wrong type"));
    return absl::OkStatus();
  };
  for (auto [name, type] : {std::pair{"format", nlohmann::json::value_t::string},
                            std::pair{"format_version", nlohmann::json::value_t::number_integer},
                            std::pair{"step", nlohmann::json::value_t::number_integer},
                            std::pair{"created", nlohmann::json::value_t::string},
                            std::pair{"files", nlohmann::json::value_t::array}}) {
    absl::Status s = field(name, type);
    if (!s.ok()) return s;
  }
  if (j["format"] != "trainsup-checkpoint") {
    return absl::InvalidArgumentError("manifest 'format' is not trainsup-checkpoint");
  }
  Manifest m;
  m.format_version = j["format_version"].get<int>();
  m.step = j["step"].get<int64_t>();
  m.created = j["created"].get<std::string>();
  for (const auto& f : j["files"]) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !f.contains("size") ||
        !f["size"].is_number_unsigned() || !f.contains("xxh3_128") || !f["xxh3_128"].is_string()) {
      return absl::InvalidArgumentError("manifest has a malformed file entry");
    }
    ManifestEntry e{f["name"].get<std::string>(), f["size"].get<uint64_t>(),
                    f["xxh3_128"].get<std::string>()};
    if (e.name.empty() || e.name.find('/') != std::string::npos || e.name == "." ||
        e.name == ".." || e.name == kManifestName) {
      return absl::InvalidArgumentError(absl::StrCat("manifest names an invalid file '", e.name, "'"));
    }
    m.files.push_back(std::move(e));
  }
  return m;
}

Hasher::Hasher() : state_(XXH3_createState()) { XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_)); }
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
