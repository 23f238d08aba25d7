// The daemon's backends for the public API and the worker channel: every
// call moves to the loop (or the store's reading thread, then the loop).
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/file_system.h"
#include "checkpoint/store.h"
#include "contracts/run_layout.h"
#include "contracts/version.h"
#include "supervisor/cluster/job_connect.h"
#include "supervisor/daemon_impl.h"
#include "supervisor/policy/auth.h"

namespace trainsup::supervisor::internal {

namespace fs = std::filesystem;

namespace {

// chmod(2), whatever the umask; the error names the path.
absl::Status SetMode(const std::string& path, mode_t mode) {
  if (chmod(path.c_str(), mode) == 0) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("chmod ", absl::StrFormat("%04o", mode), " ", path, ": ", strerror(errno)));
}

}  // namespace

// --- the API's backend -------------------------------------------------------------------------

void DaemonImpl::Submit(const v1::SubmitRunRequest& req, RunSpec spec,
                        std::function<void(absl::StatusOr<std::string>)> done) {
  // Another job's checkpoints in the shared directory: refused before
  // anything is stored. On the gRPC thread: the loop reads no shared storage.
  if (spec.cluster.present) {
    if (absl::Status s = CheckStoreAtSubmit(spec.cluster); !s.ok()) {
      done(s);
      return;
    }
  }
  asio::post(io_, [this, req, spec = std::move(spec), done]() mutable {
    if (shutting_down_) {
      done(absl::UnavailableError("trainsupd is shutting down"));
      return;
    }
    const std::string run_id = absl::StrCat(spec.name.substr(0, 40), "-", SecureRandomHex(4));
    const std::string dir = StateLayout(config_.daemon.state_dir).RunDir(run_id);
    v1::Run run;
    run.set_run_id(run_id);
    run.set_name(spec.name);
    run.set_state(v1::RUN_STATE_PENDING);
    run.set_priority(static_cast<int>(spec.priority));
    run.set_world_size(static_cast<int>(spec.world_size));
    run.set_created_ms(env_->WallMs());
    run.set_updated_ms(run.created_ms());
    run.set_spec_toml(req.spec_toml());
    // The spec's windows first (docs/guard.md): GetRun and describe list
    // every window a run skips.
    for (const StepWindow& w : spec.data.skip_windows) {
      v1::SkipWindow* sw = run.add_skip_windows();
      sw->set_first_step(w.first);
      sw->set_last_step(w.last);
      sw->set_resumed_from_step(-1);
      sw->set_reason("data.skip_windows of the spec");
    }
    run.set_reason("submitted");
    run.set_run_dir(dir);
    // The run directory and its frozen spec (fsyncs: off the loop), then
    // the run and its first event in one transaction; either failing
    // leaves nothing behind.
    asio::post(pool_, [this, req, run, spec, dir, done]() mutable {
      ckpt::FileSystem* fs = ckpt::FileSystem::Default();
      const RunLayout layout(dir);
      absl::Status w = fs->CreateDirs(layout.AttemptsDir());
      // A multi-node run's checkpoints/ is a link to its shared store, made
      // at its first attempt (ChooseResumeShared).
      const bool own_store = !spec.cluster.present;
      if (w.ok() && own_store) w = fs->CreateDirs(layout.CheckpointsDir());
      // The permission model (docs/operations.md, "Who reads what"): the
      // trainsup group (trainctl's users) may read the logs and exit files
      // (trainctl logs), never the frozen spec (command.env's values, which
      // the API redacts for viewers) nor the checkpoints (the users' models).
      if (w.ok()) w = SetMode(dir, 0710);
      if (w.ok()) w = SetMode(layout.AttemptsDir(), 0750);
      if (w.ok() && own_store) w = SetMode(layout.CheckpointsDir(), 0700);
      if (w.ok()) w = fs->WriteFileAtomically(layout.SpecPath(), req.spec_toml(), 0600);
      if (!w.ok()) {
        fs->DeleteTree(dir).IgnoreError();
        done(w);
        return;
      }
      store_->Write([this, req, run, spec, dir, done](StateStore& s) mutable {
        if (!req.request_id().empty()) {
          absl::StatusOr<std::string> existing = s.FindRunByRequestId(req.request_id());
          if (existing.ok()) {
            ckpt::FileSystem::Default()->DeleteTree(dir).IgnoreError();
            done(*existing);
            return;
          }
        }
        v1::RunEvent ev;
        ev.set_kind(v1::EVENT_KIND_STATE);
        ev.set_run_id(run.run_id());
        ev.set_time_ms(run.created_ms());
        ev.set_state(v1::RUN_STATE_PENDING);
        ev.set_rank(-1);
        ev.set_reason("submitted");
        absl::Status st = s.Transaction([&]() -> absl::Status {
          if (absl::Status c = s.CreateRun(run, req.request_id()); !c.ok()) return c;
          return s.AppendEvent(&ev).status();
        });
        absl::StatusOr<int64_t> next = st.ok() ? s.NextRunSeq() : absl::StatusOr<int64_t>(st);
        if (!st.ok() || !next.ok()) {
          ckpt::FileSystem::Default()->DeleteTree(dir).IgnoreError();
          done(st.ok() ? next.status() : st);
          return;
        }
        asio::post(io_, [this, run, spec, seq = *next - 1, ev, done]() mutable {
          log_->info("run={} submitted: {} world_size={} priority={}", run.run_id(), spec.name,
                     spec.world_size, spec.priority);
          units_[run.run_id()] =
              std::make_unique<RunUnit>(run, std::move(spec), seq, env_->env(this));
          hub_.Publish(ev);
          done(run.run_id());
          Reschedule();
        });
      });
    });
  });
}

namespace {

std::vector<v1::Checkpoint> ListCheckpoints(const std::string& run_dir) {
  std::vector<v1::Checkpoint> out;
  const std::string root = RunLayout(run_dir).CheckpointsDir();
  if (!fs::exists(root)) return out;
  ckpt::CheckpointStore store(root);
  absl::StatusOr<std::vector<ckpt::CheckpointInfo>> list = store.List();
  if (!list.ok()) return out;
  for (const ckpt::CheckpointInfo& info : *list) {
    v1::Checkpoint c;
    c.set_step(info.step);
    c.set_path(info.path);
    std::error_code ec;
    auto t = fs::last_write_time(info.path, ec);
    if (!ec) {
      auto sys = std::chrono::time_point_cast<std::chrono::milliseconds>(
          t - fs::file_time_type::clock::now() + std::chrono::system_clock::now());
      c.set_created_ms(sys.time_since_epoch().count());
    }
    int64_t bytes = 0;
    for (const auto& e : fs::directory_iterator(info.path, ec)) {
      if (e.is_regular_file(ec)) bytes += static_cast<int64_t>(e.file_size(ec));
    }
    c.set_bytes(bytes);
    out.push_back(c);
  }
  return out;
}

}  // namespace

void DaemonImpl::Get(const std::string& run_id, std::function<void(absl::StatusOr<v1::Run>)> done) {
  store_->Read([this, run_id, done](StateStore& s) {
    absl::StatusOr<v1::Run> run = s.GetRun(run_id);
    if (!run.ok()) {
      done(run.status().code() == absl::StatusCode::kNotFound
               ? absl::NotFoundError(absl::StrCat("no run ", run_id))
               : run.status());
      return;
    }
    // The checkpoint directories are walked on the pool, the live state
    // overlaid on the loop.
    asio::post(pool_, [this, run = *std::move(run), done]() mutable {
      for (const v1::Checkpoint& c : ListCheckpoints(run.run_dir())) {
        *run.add_checkpoints() = c;
      }
      asio::post(io_, [this, run = std::move(run), done]() mutable {
        if (RunUnit* u = Find(run.run_id())) u->FillLive(&run);
        done(std::move(run));
      });
    });
  });
}

void DaemonImpl::List(const v1::ListRunsRequest& req,
                      std::function<void(absl::StatusOr<v1::ListRunsResponse>)> done) {
  store_->Read([this, req, done](StateStore& s) {
    std::vector<v1::RunState> states;
    for (int st : req.states()) states.push_back(static_cast<v1::RunState>(st));
    absl::StatusOr<RunPage> page = s.ListRuns(states, req.page_size(), req.page_token());
    if (!page.ok()) {
      done(page.status());
      return;
    }
    asio::post(io_, [this, page = *std::move(page), done]() mutable {
      v1::ListRunsResponse out;
      for (v1::Run& run : page.runs) {
        if (const RunUnit* u = Find(run.run_id())) *run.mutable_progress() = u->run().progress();
        *out.add_runs() = std::move(run);
      }
      out.set_next_page_token(page.next_page_token);
      done(std::move(out));
    });
  });
}

void DaemonImpl::Watch(const v1::WatchRunRequest& req, std::shared_ptr<EventSink> sink) {
  store_->Read([this, req, sink](StateStore& s) {
    absl::StatusOr<v1::Run> run = s.GetRun(req.run_id());
    asio::post(io_, [this, req, sink, run] {
      if (!run.ok()) {
        sink->Finish(run.status().code() == absl::StatusCode::kNotFound
                         ? absl::NotFoundError(absl::StrCat("no run ", req.run_id()))
                         : run.status());
        return;
      }
      hub_.Add(*run, req.include_history(), sink);
    });
  });
}

void DaemonImpl::Cancel(const v1::CancelRunRequest& req,
                        std::function<void(absl::StatusOr<v1::Run>)> done) {
  asio::post(io_, [this, req, done] {
    RunUnit* u = Find(req.run_id());
    if (u == nullptr) {
      Get(req.run_id(), [done](absl::StatusOr<v1::Run> run) {
        if (!run.ok()) return done(run.status());
        done(absl::FailedPreconditionError(
            absl::StrCat("run ", run->run_id(), " already ended: ", StateName(run->state()))));
      });
      return;
    }
    u->Cancel(req.reason(), [this, id = req.run_id(), done](absl::Status s) {
      if (!s.ok()) return done(s);
      Get(id, done);
    });
  });
}

void DaemonImpl::FillSlot(const Slot& s, v1::Slot* slot) const {
  slot->set_index(s.index);
  slot->set_name(s.name);
  slot->set_gpu(s.gpu_index >= 0);
  slot->set_gpu_index(s.gpu_index);
  slot->set_state(s.drain ? v1::SLOT_STATE_DRAINED : ToProto(s.state));
  slot->set_run_id(s.run_id);
  slot->set_rank(s.rank);
  slot->set_reason(s.reason);
  if (s.drain) {
    slot->set_drain_reason(s.drain->reason);
    slot->set_drain_source(s.drain->source);
    slot->set_drained_ms(s.drain->since_ms);
  }
}

void DaemonImpl::Drain(const v1::DrainSlotRequest& req,
                       std::function<void(absl::StatusOr<v1::Slot>)> done) {
  asio::post(io_, [this, req, done] {
    absl::StatusOr<int> found = FindSlot(req.slot());
    if (!found.ok()) return done(found.status());
    const int index = *found;
    StoredDrain stored{slots_->DrainKey(index), req.reason(), env_->WallMs()};
    // Stored first: a drain the daemon forgets on restart would put ranks
    // back on a slot the operator took away.
    store_->Write([this, stored, index, done](StateStore& st) {
      absl::Status s = st.SetDrain(stored);
      asio::post(io_, [this, s, stored, index, done] {
        if (!s.ok()) {
          return done(
              absl::Status(s.code(), absl::StrCat("cannot store the drain: ", s.message())));
        }
        slots_->Drain(index, SlotDrain{stored.reason, kDrainOperator, stored.drained_ms});
        OnSlotDrained(slots_->slots()[index]);
        v1::Slot out;
        FillSlot(slots_->slots()[index], &out);
        done(out);
      });
    });
  });
}

void DaemonImpl::Checkpoint(const v1::CheckpointRunRequest& req,
                            std::function<void(absl::StatusOr<v1::CheckpointRunResponse>)> done) {
  asio::post(io_, [this, req, done] {
    std::vector<RunUnit*> units;
    if (req.all()) {
      for (const auto& [id, u] : units_) {
        if (u->run().state() == v1::RUN_STATE_RUNNING) units.push_back(u.get());
      }
    } else if (RunUnit* u = Find(req.run_id()); u != nullptr) {
      units.push_back(u);
    } else {
      Get(req.run_id(), [done](absl::StatusOr<v1::Run> run) {
        if (!run.ok()) return done(run.status());
        done(absl::FailedPreconditionError(
            absl::StrCat("run ", run->run_id(), " already ended: ", StateName(run->state()))));
      });
      return;
    }
    auto response = std::make_shared<v1::CheckpointRunResponse>();
    auto left = std::make_shared<size_t>(units.size());
    if (units.empty()) return done(*response);
    for (RunUnit* u : units) {
      v1::CheckpointResult* r = response->add_results();
      r->set_run_id(u->id());
      r->set_step(-1);
    }
    const double timeout_s = req.timeout_s() > 0 ? req.timeout_s() : 600;
    // The units answer on the loop, one by one; the last answer sends all.
    for (size_t i = 0; i < units.size(); ++i) {
      units[i]->RequestCheckpoint(
          timeout_s, [response, left, i, done](int64_t step, const std::string& error) {
            v1::CheckpointResult* r = response->mutable_results(static_cast<int>(i));
            r->set_step(step);
            r->set_error(error);
            if (--*left == 0) done(*response);
          });
    }
  });
}

void DaemonImpl::Undrain(const v1::UndrainSlotRequest& req,
                         std::function<void(absl::StatusOr<v1::Slot>)> done) {
  asio::post(io_, [this, req, done] {
    absl::StatusOr<int> found = FindSlot(req.slot());
    if (!found.ok()) return done(found.status());
    const int index = *found;
    if (std::string refusal = slots_->UndrainRefusal(index); !refusal.empty()) {
      return done(absl::FailedPreconditionError(refusal));
    }
    const std::string key = slots_->DrainKey(index);
    store_->Write([this, key, index, done](StateStore& st) {
      absl::Status s = st.ClearDrain(key);
      asio::post(io_, [this, s, index, done] {
        if (!s.ok()) {
          return done(
              absl::Status(s.code(), absl::StrCat("cannot store the undrain: ", s.message())));
        }
        const Slot before = slots_->slots()[index];
        slots_->Undrain(index);
        OnSlotUndrained(before, "undrained by an operator");
        v1::Slot out;
        FillSlot(slots_->slots()[index], &out);
        done(out);
      });
    });
  });
}

absl::StatusOr<int> DaemonImpl::FindSlot(const std::string& name) const {
  const int index = slots_->Find(name);
  if (index >= 0) return index;
  std::vector<std::string> names;
  for (const Slot& s : slots_->slots()) names.push_back(s.name);
  return absl::NotFoundError(absl::StrCat("no slot ", name, " on this node (",
                                          names.empty() ? "no slots" : absl::StrJoin(names, ", "),
                                          ")"));
}

void DaemonImpl::Node(std::function<void(v1::Node)> done) {
  asio::post(io_, [this, done] {
    v1::Node out;
    out.set_hostname(hostname_);
    out.set_version(std::string(trainsup::Version()));
    out.set_started_ms(started_ms_);
    out.set_uptime_s((env_->WallMs() - started_ms_) / 1000);
    out.set_nvml(slots_->nvml());
    for (const Slot& s : slots_->slots()) FillSlot(s, out.add_slots());
    for (const GpuInfo& g : slots_->gpus()) {
      v1::Gpu* gpu = out.add_gpus();
      gpu->set_index(g.index);
      gpu->set_uuid(g.uuid);
      gpu->set_name(g.name);
      gpu->set_memory_total_bytes(g.memory_total);
      gpu->set_memory_used_bytes(g.memory_used);
      gpu->set_health_error(g.health_error);
      bool stranded = false;
      for (const Slot& s : slots_->slots()) {
        if (s.gpu_index == g.index && s.state == SlotState::kStranded) {
          stranded = true;
          gpu->set_reason(s.reason);
        }
      }
      for (const Slot& s : slots_->slots()) {
        if (s.gpu_index == g.index && s.drain && s.drain->source == kDrainGpuHealth) {
          stranded = true;
          gpu->set_reason(s.drain->reason);
        }
      }
      gpu->set_healthy(!stranded);
    }
    int pending = 0, active = 0;
    for (const auto& [id, u] : units_) {
      if (u->run().state() == v1::RUN_STATE_PENDING) {
        pending++;
      } else if (!IsTerminal(u->run().state())) {
        active++;
      }
    }
    out.set_runs_pending(pending);
    out.set_runs_active(active);
    for (const std::string& key : restart_needed_) out.add_restart_needed(key);
    out.set_store_write_failures(store_failures_);
    out.set_store_error(store_error_);
    for (const auto& [id, u] : units_) {
      v1::ClusterStatus c;
      if (IsTerminal(u->run().state()) || !u->FillCluster(&c) || c.etcd_reachable()) continue;
      out.add_etcd_unreachable(absl::StrCat(c.job(), " (", id, "): ", c.etcd_error()));
    }
    done(std::move(out));
  });
}

// --- the worker channel's backend
// ------------------------------------------------------------------

void DaemonImpl::OnConnected(std::shared_ptr<WorkerStream> stream) {
  std::weak_ptr<WorkerStream> weak = stream;
  asio::post(io_, [this, weak] {
    const double timeout = config_.workers.hello_timeout_s;
    env_->Start(timeout, [weak, timeout] {
      std::shared_ptr<WorkerStream> s = weak.lock();
      if (s && !s->accepted()) {
        s->Close(absl::DeadlineExceededError(
            absl::StrCat("no hello within ", timeout, " s (workers.hello_timeout_s)")));
      }
    });
  });
}

void DaemonImpl::OnMessage(std::shared_ptr<WorkerStream> stream, wv1::WorkerMessage m) {
  asio::post(io_, [this, stream, m = std::move(m)] {
    if (m.has_hello()) {
      const wv1::Hello& h = m.hello();
      RunUnit* u = Find(h.run_id());
      absl::Status s =
          u == nullptr ? absl::UnauthenticatedError("unknown run, attempt or rank, or wrong token")
                       : u->OnHello(h, stream);
      if (!s.ok()) {
        log_->warn("rejected worker hello: run={} attempt={} rank={} pid={} version={}: {}",
                   h.run_id(), h.attempt(), h.rank(), h.pid(), h.version(),
                   std::string(s.message()));
        stream->Close(s);
        return;
      }
      stream->run_id = h.run_id();
      stream->attempt = h.attempt();
      stream->rank = h.rank();
      return;
    }
    RunUnit* u = stream->accepted() ? Find(stream->run_id) : nullptr;
    if (u == nullptr) {
      stream->Close(absl::FailedPreconditionError("send a hello first"));
      return;
    }
    u->OnWorkerMessage(stream->attempt, stream->rank, stream.get(), m);
  });
}

void DaemonImpl::OnClosed(std::shared_ptr<WorkerStream> stream) {
  asio::post(io_, [this, stream] {
    if (!stream->accepted()) return;
    if (RunUnit* u = Find(stream->run_id))
      u->OnLinkClosed(stream->attempt, stream->rank, stream.get());
  });
}

}  // namespace trainsup::supervisor::internal
