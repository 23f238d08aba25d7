#include "supervisor/cluster/memory_etcd.h"

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace trainsup::supervisor {
namespace {

bool HasPrefix(const std::string& key, const std::string& prefix) {
  return key.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

struct MemoryEtcd::State {
  using EventsFn = std::function<void(const std::vector<EtcdEvent>&, int64_t)>;
  using EndFn = std::function<void(const absl::Status&)>;
  struct Lease {
    int64_t ttl_s = 0;
    double deadline_s = 0;
  };
  // A watch's callbacks run under its gate, and its handle's destructor
  // closes the gate: no callback runs once the handle is gone.
  struct Gate {
    std::mutex mu;
    bool open = true;
  };
  struct WatchEntry {
    std::string prefix;
    EventsFn on_events;
    EndFn on_end;
    std::shared_ptr<Gate> gate;
  };
  // A delivery made under the lock, run after it is released.
  using Deliveries = std::vector<std::function<void()>>;

  UnitClock* clock = nullptr;
  std::mutex mu;
  // Invariant: revision is the mod_revision of the newest write; every kv
  // in `kvs` has mod_revision <= revision, and history holds every event
  // with mod_revision > compacted, in order.
  int64_t revision = 1;
  int64_t compacted = 0;
  int64_t next_lease = 1000;
  int64_t next_watch = 1;
  bool down = false;
  std::map<std::string, EtcdKeyValue> kvs;
  std::map<int64_t, Lease> leases;
  std::vector<EtcdEvent> history;
  std::map<int64_t, WatchEntry> watches;

  // Under mu: records a change at a new revision and queues it for watches.
  void Record(EtcdEvent event, Deliveries* out) {
    history.push_back(event);
    for (auto& [id, w] : watches) {
      if (!HasPrefix(event.kv.key, w.prefix)) continue;
      auto fn = w.on_events;
      auto gate = w.gate;
      int64_t rev = event.kv.mod_revision;
      out->push_back([fn, gate, event, rev] {
        std::lock_guard<std::mutex> lock(gate->mu);
        if (gate->open) fn({event}, rev);
      });
    }
  }
  void DeleteKey(const std::string& key, Deliveries* out) {
    auto it = kvs.find(key);
    if (it == kvs.end()) return;
    kvs.erase(it);
    EtcdEvent e;
    e.type = EtcdEvent::Type::kDelete;
    e.kv.key = key;
    e.kv.mod_revision = ++revision;
    Record(e, out);
  }
  void DropLease(int64_t id, Deliveries* out) {
    if (leases.erase(id) == 0) return;
    std::vector<std::string> doomed;
    for (auto& [k, kv] : kvs)
      if (kv.lease == id) doomed.push_back(k);
    for (auto& k : doomed) DeleteKey(k, out);
  }
  // Under mu: the leases past their deadline end, with their keys.
  void Expire(Deliveries* out) {
    double now = clock->NowS();
    std::vector<int64_t> gone;
    for (auto& [id, l] : leases)
      if (l.deadline_s <= now) gone.push_back(id);
    for (int64_t id : gone) DropLease(id, out);
  }
  void EndAll(const absl::Status& why, Deliveries* out) {
    for (auto& [id, w] : watches) {
      auto fn = w.on_end;
      auto gate = w.gate;
      out->push_back([fn, gate, why] {
        std::lock_guard<std::mutex> lock(gate->mu);
        if (gate->open) fn(why);
      });
    }
    watches.clear();
  }
  int64_t PutLocked(const std::string& key, const std::string& value, int64_t lease,
                    Deliveries* out) {
    EtcdKeyValue& kv = kvs[key];
    kv.key = key;
    kv.value = value;
    kv.lease = lease;
    kv.mod_revision = ++revision;
    if (kv.version == 0) kv.create_revision = kv.mod_revision;
    ++kv.version;
    EtcdEvent e;
    e.kv = kv;
    Record(e, out);
    return revision;
  }
};

namespace {

using State = MemoryEtcd::State;

void Run(State::Deliveries& d) {
  for (auto& fn : d) fn();
}

class MemoryWatch final : public EtcdWatch {
 public:
  MemoryWatch(std::shared_ptr<State> s, int64_t id, std::shared_ptr<State::Gate> gate)
      : s_(std::move(s)), id_(id), gate_(std::move(gate)) {}
  ~MemoryWatch() override {
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      s_->watches.erase(id_);
    }
    std::lock_guard<std::mutex> lock(gate_->mu);
    gate_->open = false;
  }

 private:
  std::shared_ptr<State> s_;
  int64_t id_;
  std::shared_ptr<State::Gate> gate_;
};

class MemoryClient final : public EtcdClient {
 public:
  explicit MemoryClient(std::shared_ptr<State> s) : s_(std::move(s)) {}

  std::string endpoints() const override { return "memory"; }

  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                              int64_t lease) override {
    State::Deliveries d;
    absl::StatusOr<int64_t> r;
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (absl::Status st = Begin(&d); !st.ok()) return st;
      if (lease != 0 && !s_->leases.count(lease))
        r = absl::NotFoundError("etcdserver: requested lease not found");
      else
        r = s_->PutLocked(key, value, lease, &d);
    }
    Run(d);
    return r;
  }

  absl::StatusOr<std::optional<EtcdKeyValue>> Get(const std::string& key) override {
    State::Deliveries d;
    std::optional<EtcdKeyValue> r;
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (absl::Status st = Begin(&d); !st.ok()) return st;
      auto it = s_->kvs.find(key);
      if (it != s_->kvs.end()) r = it->second;
    }
    Run(d);
    return r;
  }

  absl::StatusOr<EtcdRange> GetPrefix(const std::string& prefix) override {
    State::Deliveries d;
    EtcdRange r;
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (absl::Status st = Begin(&d); !st.ok()) return st;
      for (auto& [k, kv] : s_->kvs)
        if (HasPrefix(k, prefix)) r.kvs.push_back(kv);
      r.revision = s_->revision;
    }
    Run(d);
    return r;
  }

  absl::StatusOr<EtcdSwap> PutIf(const std::string& key, int64_t expected_mod_revision,
                                 const std::string& value, int64_t lease) override {
    State::Deliveries d;
    EtcdSwap r;
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (absl::Status st = Begin(&d); !st.ok()) return st;
      if (lease != 0 && !s_->leases.count(lease))
        return absl::NotFoundError("etcdserver: requested lease not found");
      auto it = s_->kvs.find(key);
      int64_t mod = it == s_->kvs.end() ? 0 : it->second.mod_revision;
      if (mod == expected_mod_revision) {
        r.succeeded = true;
        r.revision = s_->PutLocked(key, value, lease, &d);
      } else {
        r.revision = s_->revision;
        if (it != s_->kvs.end()) r.current = it->second;
      }
    }
    Run(d);
    return r;
  }

  absl::StatusOr<bool> DeleteIfUnchanged(const std::string& key, const std::string& prefix,
                                         int64_t revision) override {
    State::Deliveries d;
    bool quiet = true;
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (absl::Status st = Begin(&d); !st.ok()) return st;
      for (auto& [k, kv] : s_->kvs)
        if (HasPrefix(k, prefix) && kv.mod_revision > revision) quiet = false;
      if (quiet) s_->DeleteKey(key, &d);
    }
    Run(d);
    return quiet;
  }

  absl::StatusOr<bool> ReplacePrefix(const std::string& prefix, const std::string& if_key,
                                     int64_t if_mod_revision, const std::string& put_key,
                                     const std::string& put_value) override {
    State::Deliveries d;
    bool match = false;
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (absl::Status st = Begin(&d); !st.ok()) return st;
      auto it = s_->kvs.find(if_key);
      match = (it == s_->kvs.end() ? 0 : it->second.mod_revision) == if_mod_revision;
      if (match) {
        std::vector<std::string> doomed;
        for (auto& [k, kv] : s_->kvs)
          if (HasPrefix(k, prefix) && k != put_key) doomed.push_back(k);
        for (auto& k : doomed) s_->DeleteKey(k, &d);
        s_->PutLocked(put_key, put_value, 0, &d);
      }
    }
    Run(d);
    return match;
  }

  absl::StatusOr<int64_t> Delete(const std::string& key) override { return Erase(key, false); }
  absl::StatusOr<int64_t> DeletePrefix(const std::string& prefix) override {
    return Erase(prefix, true);
  }

  absl::StatusOr<int64_t> GrantLease(int64_t ttl_s) override {
    State::Deliveries d;
    int64_t id;
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (absl::Status st = Begin(&d); !st.ok()) return st;
      id = s_->next_lease++;
      s_->leases[id] = {ttl_s, s_->clock->NowS() + static_cast<double>(ttl_s)};
    }
    Run(d);
    return id;
  }

  absl::StatusOr<int64_t> KeepAlive(int64_t lease) override {
    State::Deliveries d;
    absl::StatusOr<int64_t> r;
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (absl::Status st = Begin(&d); !st.ok()) return st;
      auto it = s_->leases.find(lease);
      if (it == s_->leases.end()) {
        r = absl::NotFoundError("etcdserver: requested lease not found");
      } else {
        it->second.deadline_s = s_->clock->NowS() + static_cast<double>(it->second.ttl_s);
        r = it->second.ttl_s;
      }
    }
    Run(d);
    return r;
  }

  absl::Status Revoke(int64_t lease) override {
    State::Deliveries d;
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (absl::Status st = Begin(&d); !st.ok()) return st;
      s_->DropLease(lease, &d);
    }
    Run(d);
    return absl::OkStatus();
  }

  std::unique_ptr<EtcdWatch> Watch(const std::string& prefix, int64_t start_revision,
                                   State::EventsFn on_events, State::EndFn on_end) override;

 private:
  // Under mu: fails when the store is down; else expires leases.
  absl::Status Begin(State::Deliveries* d) {
    if (s_->down) return absl::UnavailableError("memory etcd: unavailable");
    s_->Expire(d);
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> Erase(const std::string& key, bool prefix) {
    State::Deliveries d;
    int64_t n = 0;
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (absl::Status st = Begin(&d); !st.ok()) return st;
      std::vector<std::string> doomed;
      for (auto& [k, kv] : s_->kvs)
        if (prefix ? HasPrefix(k, key) : k == key) doomed.push_back(k);
      for (auto& k : doomed) s_->DeleteKey(k, &d);
      n = static_cast<int64_t>(doomed.size());
    }
    Run(d);
    return n;
  }

  std::shared_ptr<State> s_;
};

std::unique_ptr<EtcdWatch> MemoryClient::Watch(const std::string& prefix, int64_t start_revision,
                                               State::EventsFn on_events, State::EndFn on_end) {
  State::Deliveries d;
  int64_t id = 0;
  auto gate = std::make_shared<State::Gate>();
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (start_revision < 0) {
      d.push_back([on_end] { on_end(absl::InvalidArgumentError("negative start revision")); });
    } else if (s_->down) {
      d.push_back([on_end] { on_end(absl::UnavailableError("memory etcd: unavailable")); });
    } else if (start_revision != 0 && start_revision <= s_->compacted) {
      d.push_back(
          [on_end] { on_end(absl::FailedPreconditionError("required revision compacted")); });
    } else {
      s_->Expire(&d);
      // Past events first, then this watch gets every later one.
      std::vector<EtcdEvent> past;
      if (start_revision != 0)
        for (auto& e : s_->history)
          if (e.kv.mod_revision >= start_revision && HasPrefix(e.kv.key, prefix)) past.push_back(e);
      if (!past.empty()) {
        int64_t rev = past.back().kv.mod_revision;
        d.push_back([on_events, gate, past, rev] {
          std::lock_guard<std::mutex> lock(gate->mu);
          if (gate->open) on_events(past, rev);
        });
      }
      id = s_->next_watch++;
      s_->watches[id] = {prefix, std::move(on_events), std::move(on_end), gate};
    }
  }
  Run(d);
  return std::make_unique<MemoryWatch>(s_, id, gate);
}

}  // namespace

MemoryEtcd::MemoryEtcd(UnitClock* clock) : state_(std::make_shared<State>()) {
  state_->clock = clock;
}
MemoryEtcd::~MemoryEtcd() = default;

std::unique_ptr<EtcdClient> MemoryEtcd::Client() { return std::make_unique<MemoryClient>(state_); }

void MemoryEtcd::SetUnavailable(bool down) {
  State::Deliveries d;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (down && !state_->down) {
      // What expired before the outage is gone before it.
      state_->Expire(&d);
      state_->EndAll(absl::UnavailableError("memory etcd: unavailable"), &d);
    } else if (!down && state_->down) {
      // As etcd restores its leases on restart: each with its full TTL.
      const double now = state_->clock->NowS();
      for (auto& [id, l] : state_->leases) l.deadline_s = now + static_cast<double>(l.ttl_s);
    }
    state_->down = down;
  }
  Run(d);
}

void MemoryEtcd::ExpireLease(int64_t lease) {
  State::Deliveries d;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->DropLease(lease, &d);
  }
  Run(d);
}

void MemoryEtcd::BreakWatches(const absl::Status& why) {
  State::Deliveries d;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->EndAll(why, &d);
  }
  Run(d);
}

void MemoryEtcd::Compact(int64_t revision) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->compacted = std::max(state_->compacted, revision - 1);
  std::erase_if(state_->history,
                [&](const EtcdEvent& e) { return e.kv.mod_revision <= state_->compacted; });
}

int64_t MemoryEtcd::revision() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->revision;
}

}  // namespace trainsup::supervisor
