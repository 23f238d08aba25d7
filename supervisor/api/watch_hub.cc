#include "supervisor/api/watch_hub.h"

#include <algorithm>

namespace trainsup::supervisor {
namespace {

bool IsTerminalState(v1::RunState s) {
  return s == v1::RUN_STATE_SUCCEEDED || s == v1::RUN_STATE_FAILED || s == v1::RUN_STATE_CANCELLED;
}

// The next page is asked for once the client has taken most of this one.
constexpr size_t kLowWater = WatchHub::kPageSize / 2;

}  // namespace

void WatchHub::Add(const v1::Run& stored, bool include_history, std::shared_ptr<EventSink> sink) {
  auto w = std::make_shared<Watcher>();
  w->sink = std::move(sink);
  w->run_id = stored.run_id();
  if (include_history) {
    ++backfilling_;
    RequestPage(w);
    return;
  }
  if (backend_.live(w->run_id)) {
    auto it = last_seq_.find(w->run_id);
    w->next_seq = (it == last_seq_.end() ? 0 : it->second) + 1;
    w->live = true;
    live_[w->run_id].push_back(std::move(w));
    return;
  }
  // Still tell the client how the run ended.
  v1::RunEvent e;
  e.set_run_id(stored.run_id());
  e.set_kind(v1::EVENT_KIND_STATE);
  e.set_state(stored.state());
  e.set_reason(stored.reason());
  e.set_time_ms(stored.ended_ms());
  e.set_rank(-1);
  w->sink->Push(e);
  w->sink->Finish(absl::OkStatus());
}

void WatchHub::RequestPage(const std::shared_ptr<Watcher>& w) {
  backend_.read_page(
      w->run_id, w->next_seq - 1, kPageSize,
      [this, w](absl::StatusOr<std::vector<v1::RunEvent>> page) { OnPage(w, std::move(page)); });
}

void WatchHub::OnPage(const std::shared_ptr<Watcher>& w,
                      absl::StatusOr<std::vector<v1::RunEvent>> page) {
  if (w->sink->finished()) {
    --backfilling_;
    return;
  }
  if (!page.ok()) {
    --backfilling_;
    w->sink->Finish(page.status());
    return;
  }
  for (const v1::RunEvent& e : *page) {
    if (e.seq() < w->next_seq) continue;
    if (!w->sink->Push(e)) {
      --backfilling_;
      return;
    }
    w->next_seq = e.seq() + 1;
  }
  const bool full = static_cast<int>(page->size()) >= kPageSize;
  const bool live = backend_.live(w->run_id);
  auto it = last_seq_.find(w->run_id);
  const int64_t published = it == last_seq_.end() ? 0 : it->second;
  if (!full && live && w->next_seq > published) {
    GoLive(w);
    return;
  }
  // Not live: read on until a page comes back empty (the terminal events
  // are committed before they are published, so a read asked for after
  // that sees them).
  if (!full && !live && page->empty()) {
    --backfilling_;
    w->sink->Finish(absl::OkStatus());
    return;
  }
  // More to read, as soon as the client has taken most of what it has.
  w->sink->NotifyWhenBelow(kLowWater, [this, w] { backend_.post([this, w] { RequestPage(w); }); });
}

void WatchHub::GoLive(const std::shared_ptr<Watcher>& w) {
  --backfilling_;
  w->live = true;
  live_[w->run_id].push_back(w);
}

void WatchHub::Publish(const v1::RunEvent& event) {
  const std::string& id = event.run_id();
  if (event.seq() > 0) {
    int64_t& last = last_seq_[id];
    last = std::max(last, event.seq());
  }
  const bool terminal = event.kind() == v1::EVENT_KIND_STATE && IsTerminalState(event.state());
  auto it = live_.find(id);
  if (it != live_.end()) {
    std::vector<std::shared_ptr<Watcher>>& ws = it->second;
    for (auto w = ws.begin(); w != ws.end();) {
      Watcher& watcher = **w;
      bool keep = !watcher.sink->finished();
      if (keep && (event.seq() == 0 || event.seq() >= watcher.next_seq)) {
        keep = watcher.sink->Push(event);
        if (event.seq() > 0) watcher.next_seq = event.seq() + 1;
      }
      if (keep && terminal) {
        watcher.sink->Finish(absl::OkStatus());
        keep = false;
      }
      w = keep ? w + 1 : ws.erase(w);
    }
    if (ws.empty()) live_.erase(it);
  }
  if (terminal) last_seq_.erase(id);
}

void WatchHub::FinishAll(const absl::Status& status) {
  for (auto& [id, ws] : live_) {
    for (auto& w : ws) w->sink->Finish(status);
  }
  live_.clear();
}

int WatchHub::watchers() const {
  int n = backfilling_;
  for (const auto& [id, ws] : live_) n += static_cast<int>(ws.size());
  return n;
}

}  // namespace trainsup::supervisor
