// A small client for etcd's v3 API: the few operations trainsupd's cluster
// coordination needs (supervisor/cluster/cluster.h), behind one interface so that
// the coordination is written against it and tests point the real client
// (MakeEtcdClient, gRPC stubs generated at build time from the .proto files
// of Debian's golang-etcd-server-dev) at a real etcd on loopback.
//
// Every call is blocking, bounded by the client's deadline, and safe from
// any thread. Errors: Unavailable/DeadlineExceeded when no endpoint answers
// (the caller retries), NotFound for a lease etcd no longer has,
// InvalidArgument for a request etcd refuses; never a crash.
#ifndef TRAINSUP_SUPERVISOR_CLUSTER_ETCD_CLIENT_H_
#define TRAINSUP_SUPERVISOR_CLUSTER_ETCD_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainsup::supervisor {

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;  // 0: none
};

struct EtcdRange {
  std::vector<EtcdKeyValue> kvs;  // sorted by key
  int64_t revision = 0;           // the store's revision the read saw
};

// The outcome of a compare-and-swap (EtcdClient::PutIf).
struct EtcdSwap {
  bool succeeded = false;
  int64_t revision = 0;                 // the store's revision after the txn
  std::optional<EtcdKeyValue> current;  // the key as it is when !succeeded
};

struct EtcdEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  EtcdKeyValue kv;  // for kDelete: key and mod_revision only
};

// A watch in progress; destroying it cancels the watch and joins its thread
// (never call that from inside its callback).
class EtcdWatch {
 public:
  virtual ~EtcdWatch() = default;
};

class EtcdClient {
 public:
  virtual ~EtcdClient() = default;

  // The endpoints, for messages ("127.0.0.1:2379,10.0.0.2:2379").
  virtual std::string endpoints() const = 0;

  // Puts `value` at `key`, attached to `lease` when nonzero. The revision.
  virtual absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                                      int64_t lease = 0) = 0;
  // The key, or nullopt when absent.
  virtual absl::StatusOr<std::optional<EtcdKeyValue>> Get(const std::string& key) = 0;
  // Every key starting with `prefix`.
  virtual absl::StatusOr<EtcdRange> GetPrefix(const std::string& prefix) = 0;
  // One transaction: if `key`'s mod_revision is `expected_mod_revision` (0:
  // the key must not exist), put `value` (with `lease` when nonzero);
  // otherwise nothing is written and `current` tells what is there. With
  // several endpoints, a swap etcd applied before the connection broke is
  // tried again on the next one and comes back !succeeded with `current`
  // holding `value`.
  virtual absl::StatusOr<EtcdSwap> PutIf(const std::string& key, int64_t expected_mod_revision,
                                         const std::string& value, int64_t lease = 0) = 0;
  // One transaction: deletes `key` (absent: OK) if no key starting with
  // `prefix` has a mod_revision above `revision`, that is, nothing under the
  // prefix was put since a read at `revision` (deletions do not count).
  // False when something was and nothing is deleted.
  virtual absl::StatusOr<bool> DeleteIfUnchanged(const std::string& key, const std::string& prefix,
                                                 int64_t revision) = 0;
  // One transaction: if `if_key`'s mod_revision is `if_mod_revision`,
  // deletes every key starting with `prefix` but `put_key` (which starts
  // with it) and puts `put_value` at `put_key`; so `put_key` is never
  // absent in between. False when the compare fails (nothing written).
  virtual absl::StatusOr<bool> ReplacePrefix(const std::string& prefix, const std::string& if_key,
                                             int64_t if_mod_revision, const std::string& put_key,
                                             const std::string& put_value) = 0;
  // Deletes `key` (absent: OK). The number of keys deleted.
  virtual absl::StatusOr<int64_t> Delete(const std::string& key) = 0;
  virtual absl::StatusOr<int64_t> DeletePrefix(const std::string& prefix) = 0;

  // A new lease of `ttl_s` seconds (etcd may grant more). Its id.
  virtual absl::StatusOr<int64_t> GrantLease(int64_t ttl_s) = 0;
  // One keep-alive of `lease`: the TTL etcd granted again, in seconds.
  // NotFound when etcd no longer has the lease (it expired or was revoked).
  virtual absl::StatusOr<int64_t> KeepAlive(int64_t lease) = 0;
  // Revokes `lease`, deleting its keys (an unknown lease: OK).
  virtual absl::Status Revoke(int64_t lease) = 0;

  // Watches every key starting with `prefix`, from `start_revision` (0: from
  // now). `on_events` runs on the watch's own thread for each batch, in
  // revision order. When the stream ends (etcd gone, the watch cancelled or
  // compacted by etcd) `on_end` runs once with the reason, on that thread,
  // and the watch is over: the caller starts another from the last revision
  // it saw + 1. Destroying the handle ends the watch without calling
  // `on_end`. `revision` is the mod_revision of the batch's last event.
  // `why`: Unavailable (or DeadlineExceeded) when the stream was lost,
  // FailedPrecondition when etcd compacted `start_revision` away (read the
  // keys again, watch from that read's revision + 1) or cancelled the
  // watch, InvalidArgument for a negative `start_revision`.
  virtual std::unique_ptr<EtcdWatch> Watch(
      const std::string& prefix, int64_t start_revision,
      std::function<void(const std::vector<EtcdEvent>& events, int64_t revision)> on_events,
      std::function<void(const absl::Status& why)> on_end) = 0;
};

// How the client reaches etcd: plain HTTP/2 when `ca_pem` is empty, as a
// loopback etcd serves it; otherwise TLS to every endpoint, etcd's server
// certificate checked against `ca_pem` and the endpoint's host, with this
// node's client certificate when `cert_pem` and `key_pem` are given (etcd's
// --client-cert-auth). PEM texts, not paths.
struct EtcdTls {
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  bool enabled() const { return !ca_pem.empty(); }
};

// Reads the PEM files of an EtcdTls: `ca_path` empty gives plain HTTP/2;
// `cert_path` and `key_path` both or neither. InvalidArgument naming the
// file (with `what`, e.g. "cluster.etcd_ca") that is missing, unreadable,
// empty or not PEM.
absl::StatusOr<EtcdTls> ReadEtcdTls(const std::string& ca_path, const std::string& cert_path,
                                    const std::string& key_path);

// A client of the etcd cluster at `endpoints` (comma-separated host:port),
// over `tls`, each call bounded by `deadline_s`. Connects lazily: an etcd
// that is down, or whose certificate is refused, is an error of the first
// call, not of this one. InvalidArgument for an empty or malformed endpoint
// list, or a client certificate without its key.
absl::StatusOr<std::unique_ptr<EtcdClient>> MakeEtcdClient(const std::string& endpoints,
                                                           double deadline_s,
                                                           const EtcdTls& tls = {});

// The end of the range of every key starting with `prefix` (etcd's
// range_end): the prefix with its last byte incremented, bytes of 0xff
// dropped first; "\0" for an empty prefix or one of only 0xff bytes.
std::string PrefixRangeEnd(const std::string& prefix);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_CLUSTER_ETCD_CLIENT_H_
