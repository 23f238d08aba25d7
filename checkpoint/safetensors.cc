#include "checkpoint/safetensors.h"

#include <ATen/ATen.h>

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace trainsup::ckpt {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"},  {at::kBFloat16, "BF16"},
    {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kShort, "I16"}, {at::kChar, "I8"},
    {at::kByte, "U8"},    {at::kBool, "BOOL"},
};

const char* DtypeToName(at::ScalarType t) {
  for (const auto& d : kDtypes) {
    if (d.type == t) return d.name;
  }
  return nullptr;
}

bool NameToDtype(const std::string& name, at::ScalarType* t) {
  for (const auto& d : kDtypes) {
    if (name == d.name) {
      *t = d.type;
      return true;
    }
  }
  return false;
}

// DataLoss "<path>: <what>": the file is not a valid safetensors file.
absl::Status Malformed(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}

// One tensor's header entry, validated: its data lies at [begin, end) of
// the data section and end - begin is exactly its size.
struct TensorEntry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

// The __metadata__ entry `m` into *metadata: it must be an object of
// strings (DataLoss otherwise).
absl::Status ReadMetadata(const std::string& path, const nlohmann::json& m,
                          std::map<std::string, std::string>* metadata) {
  if (!m.is_object()) return Malformed(path, "__metadata__ is not an object");
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (!it->is_string()) return Malformed(path, "__metadata__ values must be strings");
    (*metadata)[it.key()] = it->get<std::string>();
  }
  return absl::OkStatus();
}

// The entry of tensor `name`, checked (overflow-safe) against `data_size`
// bytes of data; DataLoss naming the tensor when it is malformed.
absl::StatusOr<TensorEntry> ReadEntry(const std::string& path, const std::string& name,
                                      const nlohmann::json& e, uint64_t data_size) {
  auto fail = [&](const std::string& what) { return Malformed(path, what); };
  if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string() || !e.contains("shape") ||
      !e["shape"].is_array() || !e.contains("data_offsets") || !e["data_offsets"].is_array() ||
      e["data_offsets"].size() != 2) {
    return fail(absl::StrCat("malformed entry for tensor '", name, "'"));
  }
  TensorEntry entry;
  entry.name = name;
  if (!NameToDtype(e["dtype"].get<std::string>(), &entry.dtype)) {
    return fail(
        absl::StrCat("tensor '", name, "' has unsupported dtype ", e["dtype"].get<std::string>()));
  }
  uint64_t bytes = c10::elementSize(entry.dtype);
  for (const auto& d : e["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX) ||
        __builtin_mul_overflow(bytes, d.get<uint64_t>(), &bytes)) {
      return fail(absl::StrCat("tensor '", name, "' has a bad or too large shape"));
    }
    entry.shape.push_back(d.get<int64_t>());
  }
  if (!e["data_offsets"][0].is_number_unsigned() || !e["data_offsets"][1].is_number_unsigned()) {
    return fail(absl::StrCat("tensor '", name, "' has bad data_offsets"));
  }
  entry.begin = e["data_offsets"][0].get<uint64_t>();
  entry.end = e["data_offsets"][1].get<uint64_t>();
  if (entry.begin > entry.end || entry.end > data_size || entry.end - entry.begin != bytes) {
    return fail(absl::StrCat("tensor '", name, "' has data_offsets [", entry.begin, ", ", entry.end,
                             "] that do not fit its ", bytes, " bytes in ", data_size,
                             " bytes of data"));
  }
  return entry;
}

// Whether the non-empty data ranges of two entries overlap.
bool RangesOverlap(const std::vector<TensorEntry>& entries) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& e : entries) {
    if (e.end > e.begin) ranges.push_back({e.begin, e.end});
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return true;
  }
  return false;
}

}  // namespace

absl::Status WriteSafetensors(const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata,
                              const ByteSink& sink) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  uint64_t offset = 0;
  std::set<std::string> names;
  for (const auto& [name, tensor] : tensors) {
    if (!names.insert(name).second || name == "__metadata__") {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name '", name, "' is repeated or reserved"));
    }
    if (!tensor.defined() || !tensor.device().is_cpu()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "' is undefined or not on the CPU"));
    }
    const char* dtype = DtypeToName(tensor.scalar_type());
    if (dtype == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has unsupported dtype ",
                                                     c10::toString(tensor.scalar_type())));
    }
    at::Tensor t = tensor.contiguous();
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {
        {"dtype", dtype}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(t);
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  uint64_t n = h.size();
  char len[8];
  std::memcpy(len, &n, 8);
  absl::Status s = sink(std::string_view(len, 8));
  if (s.ok()) s = sink(h);
  for (const at::Tensor& t : data) {
    if (!s.ok()) break;
    const char* p = static_cast<const char*>(t.data_ptr());
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    // Pieces of 64 MiB keep each write (and hash update) bounded.
    for (uint64_t done = 0; done < bytes && s.ok(); done += uint64_t{1} << 26) {
      s = sink(std::string_view(p + done, std::min<uint64_t>(bytes - done, uint64_t{1} << 26)));
    }
  }
  return s;
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(FileSystem* fs, const std::string& path) {
  auto fail = [&](const std::string& what) { return Malformed(path, what); };
  // Read failures follow Verify's contract: a missing or short file is
  // DataLoss, any other failure an I/O error (Unavailable).
  auto io = [&](const absl::Status& s) {
    return CheckpointReadError(s, absl::StrCat(path, ": ", s.message()));
  };
  auto size = fs->FileSize(path);
  if (!size.ok()) return io(size.status());
  if (*size < 8) return fail("shorter than the 8-byte header length");
  uint64_t n = 0;
  absl::Status s = fs->ReadAt(path, 0, 8, reinterpret_cast<char*>(&n));
  if (!s.ok()) return io(s);
  if (n > *size - 8 || n > (uint64_t{100} << 20)) {
    return fail(absl::StrCat("header length ", n, " exceeds the file (", *size, " bytes)"));
  }
  std::string text(n, '\0');
  s = fs->ReadAt(path, 8, n, text.data());
  if (!s.ok()) return io(s);
  nlohmann::json header = nlohmann::json::parse(text, nullptr, false);
  if (header.is_discarded() || !header.is_object()) return fail("header is not a JSON object");
  const uint64_t data_start = 8 + n;
  const uint64_t data_size = *size - data_start;
  // Validate every entry (overflow-safe) and the ranges before allocating
  // anything, so a hostile header cannot make us allocate more than the file holds.
  SafetensorsFile out;
  std::vector<TensorEntry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      s = ReadMetadata(path, *it, &out.metadata);
      if (!s.ok()) return s;
      continue;
    }
    absl::StatusOr<TensorEntry> entry = ReadEntry(path, it.key(), *it, data_size);
    if (!entry.ok()) return entry.status();
    entries.push_back(std::move(*entry));
  }
  if (RangesOverlap(entries)) return fail("tensor data ranges overlap");
  // Non-overlapping ranges inside the data: the total fits in the file.
  for (const auto& e : entries) {
    at::Tensor t;
    try {
      t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
    } catch (const c10::Error& err) {
      return absl::ResourceExhaustedError(absl::StrCat(path, ": cannot allocate tensor '", e.name,
                                                       "': ", err.what_without_backtrace()));
    }
    if (e.end > e.begin) {
      s = fs->ReadAt(path, data_start + e.begin, e.end - e.begin, static_cast<char*>(t.data_ptr()));
      if (!s.ok()) return io(s);
    }
    out.tensors[e.name] = t;
  }
  return out;
}

}  // namespace trainsup::ckpt
