#!/usr/bin/python3
"""A dashboard's view of trainsupd, in Python: the node, the runs, one run,
and a run's event stream, over the daemon's gRPC API (docs/api.md).

Needs the trainsup Python client installed (Debian's trainsup package for
/usr/bin/python3, or `pip install ./python`): its trainsup.v1 package
holds the stubs of proto/trainsup/v1/supervisor.proto.

  docs/examples/dashboard_client.py \
      --target unix:$HOME/.local/state/trainsup/run/trainsupd.sock \
      --token-file $HOME/.local/state/trainsup/auth/viewer.token list

Exit status: 0, or 1 with the gRPC status on stderr.
"""
import argparse
import sys

import grpc
from trainsup.v1 import supervisor_pb2 as pb
from trainsup.v1 import supervisor_pb2_grpc as pb_grpc


def run_line(run):
    p = run.progress
    return (f"{run.run_id} {pb.RunState.Name(run.state)} "
            f"step {p.step}/{p.total_steps} restarts {run.restarts}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True,
                    help="unix:/path/to/trainsupd.sock or host:port (TLS)")
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--ca", help="PEM CA for a TLS TCP target")
    ap.add_argument("command", choices=["node", "list", "describe", "watch"])
    ap.add_argument("run_id", nargs="?")
    args = ap.parse_args()
    if args.command in ("describe", "watch") and not args.run_id:
        ap.error(f"{args.command} needs a run id")

    with open(args.token_file) as f:
        token = f.read().strip()
    metadata = [("authorization", "Bearer " + token)]
    if args.target.startswith("unix:"):
        channel = grpc.insecure_channel(args.target)
    else:
        ca = open(args.ca, "rb").read() if args.ca else None
        channel = grpc.secure_channel(args.target, grpc.ssl_channel_credentials(ca))
    stub = pb_grpc.SupervisorStub(channel)

    try:
        if args.command == "node":
            node = stub.GetNode(pb.GetNodeRequest(), metadata=metadata, timeout=10)
            print(f"node {node.hostname} version {node.version} slots {len(node.slots)}")
        elif args.command == "list":
            token_ = ""
            while True:
                page = stub.ListRuns(pb.ListRunsRequest(page_size=100, page_token=token_),
                                     metadata=metadata, timeout=10)
                for run in page.runs:
                    print(run_line(run))
                token_ = page.next_page_token
                if not token_:
                    break
        elif args.command == "describe":
            run = stub.GetRun(pb.GetRunRequest(run_id=args.run_id), metadata=metadata,
                              timeout=10)
            print(run_line(run))
            for a in run.attempts:
                print(f"  attempt {a.number} {pb.ExitClass.Name(a.exit_class)} {a.exit_reason}")
            for c in run.checkpoints:
                print(f"  checkpoint step {c.step} {c.path}")
        else:
            # The stored history first, then live events; the daemon ends
            # the stream once the run has ended.
            req = pb.WatchRunRequest(run_id=args.run_id, include_history=True)
            for event in stub.WatchRun(req, metadata=metadata):
                print(f"{event.seq} {pb.EventKind.Name(event.kind)} {pb.RunState.Name(event.state)} "
                      f"{event.reason}")
    except grpc.RpcError as e:
        print(f"{e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
