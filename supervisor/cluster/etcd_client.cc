#include "supervisor/cluster/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace trainsup::supervisor {
namespace {

namespace pb = ::etcdserverpb;
using Clock = std::chrono::system_clock;

// A channel per endpoint, each with its own stubs. A call goes to the
// endpoint that answered last and moves on to the next only when one is
// Unavailable (refused, reset, no leader): any other answer, error or not,
// is etcd's and is returned as it is.
struct Endpoint {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::unique_ptr<pb::Watch::Stub> watch;
  std::atomic<bool> used{false};  // a call went to it: ChannelPoller keeps it connected
};

// Shared by the client and its watches, so a watch may outlive its client.
struct Endpoints {
  std::vector<Endpoint> list;
  std::string joined;                // "a:1,b:2", for endpoints() and messages
  std::atomic<size_t> preferred{0};  // the index that answered last
};

std::string Quote(const std::string& key) {
  return absl::StrCat("\"", absl::CHexEscape(key), "\"");
}

std::string CodeName(absl::StatusCode code) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(code));
}

absl::StatusCode CodeOf(const grpc::Status& status) {
  // gRPC's and abseil's codes are the same numbers.
  return static_cast<absl::StatusCode>(status.error_code());
}

// "etcd at A: OP: unavailable: MESSAGE" for one endpoint's answer.
absl::Status ToStatus(const std::string& where, const std::string& op, absl::StatusCode code,
                      const std::string& message) {
  return absl::Status(
      code, absl::StrCat("etcd at ", where, ": ", op, ": ", CodeName(code), ": ", message));
}

// One RPC on one endpoint, its context already bounded by the deadline.
using Rpc = std::function<grpc::Status(Endpoint& endpoint, grpc::ClientContext* context)>;

// Runs `rpc` on the endpoints, the preferred one first, all of them within
// one deadline; the first answer that is not Unavailable ends the loop.
absl::Status CallEndpoints(Endpoints& endpoints, double deadline_s, const std::string& op,
                           const Rpc& rpc) {
  const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                        std::chrono::duration<double>(deadline_s));
  const size_t n = endpoints.list.size();
  const size_t first = endpoints.preferred.load() % n;
  std::vector<std::string> failures;
  absl::StatusCode last_code = absl::StatusCode::kUnavailable;
  for (size_t k = 0; k < n; ++k) {
    if (k > 0 && Clock::now() >= deadline) {
      last_code = absl::StatusCode::kDeadlineExceeded;
      failures.push_back("the deadline passed before the other endpoints were tried");
      break;
    }
    const size_t i = (first + k) % n;
    Endpoint& endpoint = endpoints.list[i];
    endpoint.used.store(true);
    grpc::ClientContext context;
    context.set_deadline(deadline);
    grpc::Status status = rpc(endpoint, &context);
    const absl::StatusCode code = CodeOf(status);
    if (code != absl::StatusCode::kUnavailable) {
      endpoints.preferred.store(i);
      if (status.ok()) return absl::OkStatus();
      if (failures.empty()) return ToStatus(endpoint.address, op, code, status.error_message());
    }
    last_code = code;
    failures.push_back(n == 1 ? absl::StrCat(CodeName(code), ": ", status.error_message())
                              : absl::StrCat(endpoint.address, ": ", CodeName(code), ": ",
                                             status.error_message()));
    if (code != absl::StatusCode::kUnavailable) break;
  }
  return absl::Status(last_code, absl::StrCat("etcd at ", endpoints.joined, ": ", op, ": ",
                                              absl::StrJoin(failures, "; ")));
}

EtcdKeyValue FromProto(const mvccpb::KeyValue& kv) {
  EtcdKeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

// etcd refuses an empty key; the range of every key is ["\0", "\0").
std::string RangeStart(const std::string& prefix) {
  return prefix.empty() ? std::string(1, '\0') : prefix;
}

// host:port, an IPv6 host in brackets; the scheme of the transport
// ("http://" in plain text, "https://" over TLS) allowed and dropped.
absl::StatusOr<std::string> ParseEndpoint(absl::string_view text, bool tls) {
  absl::string_view e = absl::StripAsciiWhitespace(text);
  const std::string shown = absl::StrCat("\"", absl::CHexEscape(e), "\"");
  if (e.empty()) return absl::InvalidArgumentError("empty endpoint");
  const char* scheme = tls ? "https://" : "http://";
  absl::ConsumePrefix(&e, scheme);
  if (e.find("://") != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("etcd endpoint ", shown, ": only host:port (or ",
                                                   scheme, "host:port) is supported",
                                                   tls ? " over TLS" : " without TLS"));
  }
  absl::string_view host;
  absl::string_view port;
  if (absl::StartsWith(e, "[")) {
    const size_t close = e.find(']');
    if (close == absl::string_view::npos || close + 1 >= e.size() || e[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint ", shown, ": an IPv6 host needs the form [addr]:port"));
    }
    host = e.substr(1, close - 1);
    port = e.substr(close + 2);
  } else {
    const size_t colon = e.rfind(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint ", shown, ": no port (expected host:port)"));
    }
    host = e.substr(0, colon);
    port = e.substr(colon + 1);
    if (host.find(':') != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint ", shown, ": an IPv6 host needs the form [addr]:port"));
    }
  }
  if (host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd endpoint ", shown, ": no host"));
  }
  for (char c : host) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_' &&
        c != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint ", shown, ": bad character in the host"));
    }
  }
  int number = 0;
  if (port.empty() || !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port, &number) || number < 1 || number > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint ", shown, ": the port must be a number in 1..65535"));
  }
  return std::string(e);
}

grpc::ChannelArguments ChannelArgs(double deadline_s) {
  grpc::ChannelArguments args;
  // etcd restarted is reached again within a second, not after gRPC's
  // default backoff of up to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // How long one connection attempt may take (gRPC's default is 20 s): an
  // etcd that accepts but does not answer (stopped) is given up on sooner.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              static_cast<int>(std::clamp(deadline_s, 1.0, 20.0) * 1000));
  // A watch stream to an etcd that stopped answering (machine gone,
  // partition) ends after a ping goes unanswered for the call deadline.
  // Pings no more often than every 10 s: etcd's servers refuse clients that
  // ping more often than --grpc-keepalive-min-time (5 s by default).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
              static_cast<int>(std::clamp(deadline_s, 1.0, 60.0) * 1000));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // A prefix read may exceed gRPC's default 4 MiB.
  args.SetMaxReceiveMessageSize(64 << 20);
  return args;
}

// gRPC advances a connection attempt (the TCP connect, the HTTP/2
// handshake) only while some thread polls it, and a fail-fast call on a
// channel that is not READY fails at once without polling. Without this
// thread a channel whose etcd went away stays in TRANSIENT_FAILURE after
// etcd is back, every call failing with the old "connection refused", until
// gRPC's backup poller happens by (every 5 s) or the attempt times out
// unread. It keeps every endpoint that has had a call connected or
// reconnecting, so calls fail fast while etcd is down and succeed within
// about a second (the reconnect backoff's cap) after it is back.
class ChannelPoller {
 public:
  explicit ChannelPoller(std::shared_ptr<Endpoints> endpoints)
      : endpoints_(std::move(endpoints)), thread_([this] { Run(); }) {}
  ~ChannelPoller() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

 private:
  static constexpr std::chrono::milliseconds kSlice{50};

  void Run() {
    for (;;) {
      bool polled = false;
      for (Endpoint& endpoint : endpoints_->list) {
        if (Stopping()) return;
        if (!endpoint.used.load()) continue;
        const grpc_connectivity_state state = endpoint.channel->GetState(true);
        if (state == GRPC_CHANNEL_READY) continue;
        endpoint.channel->WaitForStateChange(state, Clock::now() + kSlice);
        polled = true;
      }
      if (!polled) {
        std::unique_lock<std::mutex> lock(mu_);
        if (wake_.wait_for(lock, 2 * kSlice, [this] { return stop_; })) return;
      }
    }
  }

  bool Stopping() {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_;
  }

  const std::shared_ptr<Endpoints> endpoints_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

using EventsCallback = std::function<void(const std::vector<EtcdEvent>&, int64_t)>;
using EndCallback = std::function<void(const absl::Status&)>;

// One watch: a thread running one Watch stream at a time.
class GrpcWatch final : public EtcdWatch {
 public:
  GrpcWatch(std::shared_ptr<Endpoints> endpoints, std::string prefix, int64_t start_revision,
            EventsCallback on_events, EndCallback on_end)
      : endpoints_(std::move(endpoints)),
        prefix_(std::move(prefix)),
        start_revision_(start_revision),
        on_events_(std::move(on_events)),
        on_end_(std::move(on_end)) {
    thread_ = std::thread([this] { Run(); });
  }

  ~GrpcWatch() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      if (context_ != nullptr) context_->TryCancel();
    }
    thread_.join();
  }

 private:
  void Run() {
    absl::Status why = Stream();
    if (!Cancelled()) on_end_(why);
  }

  bool Cancelled() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_;
  }

  std::string Op() const {
    return absl::StrCat("Watch ", Quote(prefix_), " from revision ", start_revision_);
  }

  // Streams from the endpoints in turn until one has created the watch;
  // after that the first end of that stream is the watch's end.
  absl::Status Stream() {
    const std::string op = Op();
    if (start_revision_ < 0) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": negative start revision"));
    }
    const size_t n = endpoints_->list.size();
    const size_t first = endpoints_->preferred.load() % n;
    std::vector<std::string> failures;
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (first + k) % n;
      Endpoint& endpoint = endpoints_->list[i];
      endpoint.used.store(true);
      bool created = false;
      grpc::Status status = StreamFrom(endpoint, &created);
      if (Cancelled()) return absl::CancelledError(op);
      if (!status.ok() && status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
        // Ours (compaction, cancel): the message is complete.
        return absl::Status(
            absl::StatusCode::kFailedPrecondition,
            absl::StrCat("etcd at ", endpoint.address, ": ", op, ": ", status.error_message()));
      }
      const absl::StatusCode code = status.ok() ? absl::StatusCode::kUnavailable : CodeOf(status);
      const std::string message = status.ok() ? "the stream ended" : status.error_message();
      if (created || code != absl::StatusCode::kUnavailable) {
        return ToStatus(endpoint.address, op, code, message);
      }
      failures.push_back(absl::StrCat(endpoint.address, ": ", CodeName(code), ": ", message));
    }
    return absl::UnavailableError(absl::StrCat("etcd at ", endpoints_->joined, ": ", op, ": ",
                                               absl::StrJoin(failures, "; ")));
  }

  // One stream. FAILED_PRECONDITION (made here, never by gRPC) when etcd
  // ended the watch: compaction or a cancel.
  grpc::Status StreamFrom(Endpoint& endpoint, bool* created) {
    grpc::ClientContext* context = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_) return grpc::Status::CANCELLED;
      context_ = std::make_unique<grpc::ClientContext>();
      context = context_.get();
    }
    std::unique_ptr<grpc::ClientReaderWriter<pb::WatchRequest, pb::WatchResponse>> stream =
        endpoint.watch->Watch(context);
    pb::WatchRequest request;
    pb::WatchCreateRequest* create = request.mutable_create_request();
    create->set_key(RangeStart(prefix_));
    create->set_range_end(PrefixRangeEnd(prefix_));
    create->set_start_revision(start_revision_);
    if (!stream->Write(request)) return stream->Finish();
    pb::WatchResponse response;
    std::vector<EtcdEvent> events;
    while (stream->Read(&response)) {
      if (response.compact_revision() > 0) {
        context->TryCancel();
        stream->Finish();
        return grpc::Status(
            grpc::StatusCode::FAILED_PRECONDITION,
            absl::StrCat("compacted: etcd keeps revisions from ", response.compact_revision(),
                         " on; read the keys again and watch from there"));
      }
      if (response.canceled()) {
        context->TryCancel();
        stream->Finish();
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            absl::StrCat("cancelled by etcd: ", response.cancel_reason()));
      }
      if (response.created()) *created = true;
      if (response.events_size() == 0) continue;
      events.clear();
      events.reserve(response.events_size());
      for (const mvccpb::Event& event : response.events()) {
        EtcdEvent out;
        out.type = event.type() == mvccpb::Event::DELETE ? EtcdEvent::Type::kDelete
                                                         : EtcdEvent::Type::kPut;
        out.kv = FromProto(event.kv());
        events.push_back(std::move(out));
      }
      if (Cancelled()) break;
      on_events_(events, events.back().kv.mod_revision);
    }
    return stream->Finish();
  }

  const std::shared_ptr<Endpoints> endpoints_;
  const std::string prefix_;
  const int64_t start_revision_;
  const EventsCallback on_events_;
  const EndCallback on_end_;
  std::mutex mu_;
  bool cancelled_ = false;                        // guarded by mu_
  std::unique_ptr<grpc::ClientContext> context_;  // the stream's; replaced under mu_
  std::thread thread_;
};

class GrpcEtcdClient final : public EtcdClient {
 public:
  GrpcEtcdClient(std::shared_ptr<Endpoints> endpoints, double deadline_s)
      : endpoints_(endpoints), deadline_s_(deadline_s), poller_(std::move(endpoints)) {}

  std::string endpoints() const override { return endpoints_->joined; }

  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                              int64_t lease) override {
    pb::PutRequest request;
    request.set_key(key);
    request.set_value(value);
    request.set_lease(lease);
    pb::PutResponse response;
    absl::Status status = Call(absl::StrCat("Put ", Quote(key)), [&](Endpoint& e, auto* context) {
      return e.kv->Put(context, request, &response);
    });
    if (!status.ok()) return status;
    return response.header().revision();
  }

  absl::StatusOr<std::optional<EtcdKeyValue>> Get(const std::string& key) override {
    pb::RangeRequest request;
    request.set_key(key);
    pb::RangeResponse response;
    absl::Status status = Call(absl::StrCat("Get ", Quote(key)), [&](Endpoint& e, auto* context) {
      return e.kv->Range(context, request, &response);
    });
    if (!status.ok()) return status;
    if (response.kvs_size() == 0) return std::optional<EtcdKeyValue>();
    return std::optional<EtcdKeyValue>(FromProto(response.kvs(0)));
  }

  absl::StatusOr<EtcdRange> GetPrefix(const std::string& prefix) override {
    pb::RangeRequest request;
    request.set_key(RangeStart(prefix));
    request.set_range_end(PrefixRangeEnd(prefix));
    pb::RangeResponse response;
    absl::Status status =
        Call(absl::StrCat("GetPrefix ", Quote(prefix)),
             [&](Endpoint& e, auto* context) { return e.kv->Range(context, request, &response); });
    if (!status.ok()) return status;
    EtcdRange range;
    range.revision = response.header().revision();
    range.kvs.reserve(response.kvs_size());
    for (const mvccpb::KeyValue& kv : response.kvs()) range.kvs.push_back(FromProto(kv));
    return range;
  }

  absl::StatusOr<EtcdSwap> PutIf(const std::string& key, int64_t expected_mod_revision,
                                 const std::string& value, int64_t lease) override {
    const std::string op =
        absl::StrCat("PutIf ", Quote(key), " at mod_revision ", expected_mod_revision);
    if (expected_mod_revision < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd at ", endpoints_->joined, ": ", op, ": negative revision"));
    }
    pb::TxnRequest request;
    pb::Compare* compare = request.add_compare();
    compare->set_key(key);
    compare->set_result(pb::Compare::EQUAL);
    if (expected_mod_revision == 0) {
      // Absent: a key that exists has a create_revision > 0.
      compare->set_target(pb::Compare::CREATE);
      compare->set_create_revision(0);
    } else {
      compare->set_target(pb::Compare::MOD);
      compare->set_mod_revision(expected_mod_revision);
    }
    pb::PutRequest* put = request.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value(value);
    put->set_lease(lease);
    request.add_failure()->mutable_request_range()->set_key(key);
    pb::TxnResponse response;
    absl::Status status = Call(
        op, [&](Endpoint& e, auto* context) { return e.kv->Txn(context, request, &response); });
    if (!status.ok()) return status;
    EtcdSwap swap;
    swap.succeeded = response.succeeded();
    swap.revision = response.header().revision();
    if (!swap.succeeded && response.responses_size() == 1 &&
        response.responses(0).response_range().kvs_size() > 0) {
      swap.current = FromProto(response.responses(0).response_range().kvs(0));
    }
    return swap;
  }

  absl::StatusOr<bool> DeleteIfUnchanged(const std::string& key, const std::string& prefix,
                                         int64_t revision) override {
    pb::TxnRequest request;
    pb::Compare* compare = request.add_compare();
    compare->set_key(RangeStart(prefix));
    compare->set_range_end(PrefixRangeEnd(prefix));
    compare->set_target(pb::Compare::MOD);
    compare->set_result(pb::Compare::LESS);
    compare->set_mod_revision(revision + 1);
    request.add_success()->mutable_request_delete_range()->set_key(key);
    return TxnSucceeded(absl::StrCat("Delete ", Quote(key), " if nothing under ", Quote(prefix),
                                     " changed since revision ", revision),
                        request);
  }

  absl::StatusOr<bool> ReplacePrefix(const std::string& prefix, const std::string& if_key,
                                     int64_t if_mod_revision, const std::string& put_key,
                                     const std::string& put_value) override {
    pb::TxnRequest request;
    pb::Compare* compare = request.add_compare();
    compare->set_key(if_key);
    compare->set_target(pb::Compare::MOD);
    compare->set_result(pb::Compare::EQUAL);
    compare->set_mod_revision(if_mod_revision);
    // etcd refuses a put inside a deleted range: two ranges around it.
    pb::DeleteRangeRequest* below = request.add_success()->mutable_request_delete_range();
    below->set_key(RangeStart(prefix));
    below->set_range_end(put_key);
    pb::DeleteRangeRequest* above = request.add_success()->mutable_request_delete_range();
    above->set_key(put_key + std::string(1, '\0'));
    above->set_range_end(PrefixRangeEnd(prefix));
    pb::PutRequest* put = request.add_success()->mutable_request_put();
    put->set_key(put_key);
    put->set_value(put_value);
    return TxnSucceeded(absl::StrCat("ReplacePrefix ", Quote(prefix), " if ", Quote(if_key),
                                     " is at mod_revision ", if_mod_revision),
                        request);
  }

  absl::StatusOr<int64_t> Delete(const std::string& key) override {
    pb::DeleteRangeRequest request;
    request.set_key(key);
    return DeleteRange(absl::StrCat("Delete ", Quote(key)), request);
  }

  absl::StatusOr<int64_t> DeletePrefix(const std::string& prefix) override {
    pb::DeleteRangeRequest request;
    request.set_key(RangeStart(prefix));
    request.set_range_end(PrefixRangeEnd(prefix));
    return DeleteRange(absl::StrCat("DeletePrefix ", Quote(prefix)), request);
  }

  absl::StatusOr<int64_t> GrantLease(int64_t ttl_s) override {
    const std::string op = absl::StrCat("GrantLease ", ttl_s, " s");
    if (ttl_s <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd at ", endpoints_->joined, ": ", op, ": the TTL must be positive"));
    }
    pb::LeaseGrantRequest request;
    request.set_ttl(ttl_s);
    pb::LeaseGrantResponse response;
    absl::Status status = Call(op, [&](Endpoint& e, auto* context) {
      return e.lease->LeaseGrant(context, request, &response);
    });
    if (!status.ok()) return status;
    if (!response.error().empty() || response.id() == 0) {
      return absl::UnknownError(absl::StrCat("etcd at ", endpoints_->joined, ": ", op,
                                             ": no lease granted: ", response.error()));
    }
    return response.id();
  }

  absl::StatusOr<int64_t> KeepAlive(int64_t lease) override {
    const std::string op = absl::StrCat("KeepAlive lease ", lease);
    pb::LeaseKeepAliveRequest request;
    request.set_id(lease);
    pb::LeaseKeepAliveResponse response;
    absl::Status status = Call(op, [&](Endpoint& e, grpc::ClientContext* context) {
      auto stream = e.lease->LeaseKeepAlive(context);
      if (!stream->Write(request)) return stream->Finish();
      const bool answered = stream->Read(&response);
      stream->WritesDone();
      grpc::Status finished = stream->Finish();
      // etcd ends the stream cleanly after the half-close; an answer read is
      // the answer whatever the end.
      return answered ? grpc::Status::OK : finished;
    });
    if (!status.ok()) return status;
    // etcd answers a lease it no longer has with TTL 0 rather than an error.
    if (response.ttl() <= 0) {
      return absl::NotFoundError(absl::StrCat("etcd at ", endpoints_->joined, ": ", op,
                                              ": not found (expired or revoked)"));
    }
    return response.ttl();
  }

  absl::Status Revoke(int64_t lease) override {
    pb::LeaseRevokeRequest request;
    request.set_id(lease);
    pb::LeaseRevokeResponse response;
    absl::Status status =
        Call(absl::StrCat("Revoke lease ", lease), [&](Endpoint& e, auto* context) {
          return e.lease->LeaseRevoke(context, request, &response);
        });
    // etcd: "requested lease not found": already gone, which is the goal.
    if (absl::IsNotFound(status)) return absl::OkStatus();
    return status;
  }

  std::unique_ptr<EtcdWatch> Watch(const std::string& prefix, int64_t start_revision,
                                   EventsCallback on_events, EndCallback on_end) override {
    return std::make_unique<GrpcWatch>(endpoints_, prefix, start_revision, std::move(on_events),
                                       std::move(on_end));
  }

 private:
  absl::Status Call(const std::string& op, const Rpc& rpc) {
    return CallEndpoints(*endpoints_, deadline_s_, op, rpc);
  }

  // Whether the transaction's compares held (its success ops applied).
  absl::StatusOr<bool> TxnSucceeded(const std::string& op, const pb::TxnRequest& request) {
    pb::TxnResponse response;
    absl::Status status = Call(
        op, [&](Endpoint& e, auto* context) { return e.kv->Txn(context, request, &response); });
    if (!status.ok()) return status;
    return response.succeeded();
  }

  absl::StatusOr<int64_t> DeleteRange(const std::string& op,
                                      const pb::DeleteRangeRequest& request) {
    pb::DeleteRangeResponse response;
    absl::Status status = Call(op, [&](Endpoint& e, auto* context) {
      return e.kv->DeleteRange(context, request, &response);
    });
    if (!status.ok()) return status;
    return response.deleted();
  }

  const std::shared_ptr<Endpoints> endpoints_;
  const double deadline_s_;
  ChannelPoller poller_;
};

}  // namespace

absl::StatusOr<EtcdTls> ReadEtcdTls(const std::string& ca_path, const std::string& cert_path,
                                    const std::string& key_path) {
  EtcdTls tls;
  if (ca_path.empty()) {
    if (!cert_path.empty() || !key_path.empty()) {
      return absl::InvalidArgumentError(
          "cluster.etcd_ca: required with a client certificate (the CA of etcd's server "
          "certificate)");
    }
    return tls;
  }
  if (cert_path.empty() != key_path.empty()) {
    return absl::InvalidArgumentError(
        "cluster.etcd_cert and cluster.etcd_key: a client certificate needs both");
  }
  const auto read = [](const char* what, const std::string& path, std::string* out) {
    if (path.empty()) return absl::OkStatus();
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    if (in) text << in.rdbuf();
    if (!in || in.bad()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": cannot read ", path, ": ", std::strerror(errno)));
    }
    *out = text.str();
    if (out->find("-----BEGIN ") == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, " is not a PEM file"));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = read("cluster.etcd_ca", ca_path, &tls.ca_pem); !s.ok()) return s;
  if (absl::Status s = read("cluster.etcd_cert", cert_path, &tls.cert_pem); !s.ok()) return s;
  if (absl::Status s = read("cluster.etcd_key", key_path, &tls.key_pem); !s.ok()) return s;
  return tls;
}

absl::StatusOr<std::unique_ptr<EtcdClient>> MakeEtcdClient(const std::string& endpoints,
                                                           double deadline_s, const EtcdTls& tls) {
  if (!(deadline_s > 0) || !std::isfinite(deadline_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "etcd client: the deadline must be a positive number of seconds, not ", deadline_s));
  }
  auto parsed = std::make_shared<Endpoints>();
  std::vector<std::string> addresses;
  if (absl::StripAsciiWhitespace(endpoints).empty()) {
    return absl::InvalidArgumentError("etcd client: no endpoints (expected host:port,...)");
  }
  for (absl::string_view part : absl::StrSplit(endpoints, ',')) {
    absl::StatusOr<std::string> address = ParseEndpoint(part, tls.enabled());
    if (!address.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd endpoints \"", absl::CHexEscape(endpoints), "\": ", address.status().message()));
    }
    addresses.push_back(*std::move(address));
  }
  if (tls.cert_pem.empty() != tls.key_pem.empty() || (!tls.enabled() && !tls.cert_pem.empty())) {
    return absl::InvalidArgumentError(
        "etcd client: a client certificate needs its key and the CA of etcd's certificate");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (tls.enabled()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = tls.ca_pem;
    ssl.pem_private_key = tls.key_pem;
    ssl.pem_cert_chain = tls.cert_pem;
    credentials = grpc::SslCredentials(ssl);
  }
  const grpc::ChannelArguments args = ChannelArgs(deadline_s);
  parsed->list = std::vector<Endpoint>(addresses.size());
  for (size_t i = 0; i < addresses.size(); ++i) {
    Endpoint& endpoint = parsed->list[i];
    endpoint.address = addresses[i];
    endpoint.channel = grpc::CreateCustomChannel(addresses[i], credentials, args);
    endpoint.kv = pb::KV::NewStub(endpoint.channel);
    endpoint.lease = pb::Lease::NewStub(endpoint.channel);
    endpoint.watch = pb::Watch::NewStub(endpoint.channel);
  }
  parsed->joined = absl::StrJoin(addresses, ",");
  return std::unique_ptr<EtcdClient>(new GrpcEtcdClient(std::move(parsed), deadline_s));
}

std::string PrefixRangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    const unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

}  // namespace trainsup::supervisor
