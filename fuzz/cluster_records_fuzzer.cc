// The multi-node job's records as anyone who can write to etcd may leave
// them (supervisor/policy/cluster_protocol.h): the first byte picks a join
// record, a generation record or a key, the rest is the value. Decoding
// never crashes; what decodes encodes (never throws, whatever its bytes)
// and decodes back to the same record; the record that follows a decoded
// generation encodes and decodes too, with an exit detail of raw bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "supervisor/policy/cluster_protocol.h"

namespace {

using namespace trainsup::supervisor;

bool SameJoin(const JoinRecord& a, const JoinRecord& b) {
  return a.node == b.node && a.run_id == b.run_id && a.attempt == b.attempt &&
         a.address == b.address && a.port == b.port && a.steps == b.steps;
}

bool SameGeneration(const GenerationRecord& a, const GenerationRecord& b) {
  if (a.generation != b.generation || a.action != b.action || a.restarts != b.restarts ||
      a.delay_s != b.delay_s || a.by != b.by || a.reason != b.reason ||
      a.history.size() != b.history.size()) {
    return false;
  }
  for (size_t i = 0; i < a.history.size(); ++i) {
    const AttemptEnd& x = a.history[i];
    const AttemptEnd& y = b.history[i];
    if (x.end_s != y.end_s || x.cls != y.cls || x.made_progress != y.made_progress ||
        x.detail != y.detail) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using trainsup::fuzz::Check;
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: {
      absl::StatusOr<JoinRecord> j = DecodeJoin(text);
      if (!j.ok()) return 0;
      absl::StatusOr<JoinRecord> again = DecodeJoin(EncodeJoin(*j));
      Check(again.ok() && SameJoin(*j, *again), "a join record round-trips");
      JoinRecord raw = *j;
      raw.node = text;  // a node name from a key: any bytes
      Check(DecodeJoin(EncodeJoin(raw)).ok(), "a join record of any node name encodes");
      break;
    }
    case 1: {
      absl::StatusOr<GenerationRecord> g = DecodeGeneration(text);
      if (!g.ok()) return 0;
      absl::StatusOr<GenerationRecord> again = DecodeGeneration(EncodeGeneration(*g));
      Check(again.ok() && SameGeneration(*g, *again), "a generation record round-trips");
      if (g->generation >= INT64_MAX - 1 || g->restarts >= INT64_MAX - 1) return 0;
      AttemptEnd end;
      end.end_s = 1;
      end.detail = text;
      const GenerationRecord next = NextGeneration(*g, end, RestartPolicy{}, "node", text);
      Check(DecodeGeneration(EncodeGeneration(next)).ok(), "the next generation encodes");
      break;
    }
    default: {
      const JobKeys keys("job");
      const JobKeys::Parsed p = keys.Parse(keys.prefix() + text);
      Check(p.kind.empty() || p.kind == "spec" || p.kind == "generation" ||
                p.kind == "submission" || p.kind == "node" || p.kind == "join",
            "a key parses to a known kind or none");
      break;
    }
  }
  return 0;
}
