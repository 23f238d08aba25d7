"""The Python side of the worker channel (proto/trainsup/v1/worker.proto),
mirroring worker/link.{h,cc}: one bidirectional gRPC stream to trainsupd
that carries a Hello, then a Heartbeat every interval, events and an exit
report, and brings back the daemon's commands (CheckpointNow, Stop).

Everything runs on daemon threads; nothing here blocks the training loop
(report_exit waits only as long as it is told to). When the stream breaks
the link reconnects with a backoff that doubles from reconnect_initial_s to
reconnect_max_s (back to the initial one after a welcomed connection),
forever, while training goes on: the daemon may be restarting. An
unexpected exception on the link thread is written to stderr and the link
reconnects the same way. The one refusal no reconnect mends, a version the
daemon cannot serve (FAILED_PRECONDITION before the Welcome), ends the
thread and calls on_refused with the daemon's message.
"""

import collections
import os
import sys
import threading
import time
import traceback

MAX_QUEUED_EVENTS = 1000
# How long a stopping link waits for the daemon to end the half-closed
# stream, and for the thread before it cancels the call.
_HALF_CLOSE_GRACE_S = 0.5
_STOP_GRACE_S = 2.0


def _stubs():
    try:
        from trainsup.v1 import supervisor_pb2, worker_pb2, worker_pb2_grpc
    except ImportError as e:
        raise ImportError(
            "trainsup: the generated worker-channel stubs are not importable (%s); install the "
            "client as a package (pip install ./python, or Debian's trainsup package), which "
            "generates them" % e) from e
    return supervisor_pb2, worker_pb2, worker_pb2_grpc


class _Connection:
    """One stream's state, shared by its request generator and reader."""

    def __init__(self):
        self.welcomed = False
        self.ended = False
        self.call = None
        self.refusal = None  # the daemon's message when it refused the Hello for good


class Link:
    def __init__(self, endpoint, run_id, rank, attempt, world_size, token, version,
                 heartbeat_interval_s=1.0, reconnect_initial_s=0.1, reconnect_max_s=5.0,
                 on_refused=None):
        import grpc  # only under trainsupd: the no-op client needs no grpc
        self._grpc = grpc
        self._pb, self._wpb, self._wgrpc = _stubs()
        self._endpoint = endpoint
        self._run_id = run_id
        self._rank = rank
        self._attempt = attempt
        self._world_size = world_size
        self._token = token
        self._version = version
        self._on_refused = on_refused
        self._interval_s = heartbeat_interval_s
        self._reconnect_initial_s = reconnect_initial_s
        self._reconnect_max_s = reconnect_max_s

        self._cv = threading.Condition()
        self._thread = None
        self._started = False
        self._stopping = False
        self._finished = False
        self._conn = None
        self._events = collections.deque()
        self._dropped_events = 0
        self._popped_events = 0  # events removed from the front so far
        self._exit_report = None
        self._exit_generation = 0
        self._exit_written = 0
        self._flush_generation = 0
        self._flush_written = 0
        self._progress = self._pb.Progress()
        self._heartbeat_seq = 0
        self._progress_counter = 0  # advanced only by advance_progress()

        self.checkpoint_requested = False
        self.stop_requested = False
        self.stop_deadline_s = 0
        self.stop_reason = ""
        self.connects = 0

    # The training loop's side.

    def start(self):
        with self._cv:
            if self._started or self._stopping:
                return
            self._started = True
            self._thread = threading.Thread(target=self._run, name="trainsup-link", daemon=True)
            self._thread.start()

    def update_progress(self, progress):
        with self._cv:
            self._progress.CopyFrom(progress)

    def advance_progress(self):
        with self._cv:
            self._progress_counter += 1

    def flush(self, timeout_s):
        """Sends a heartbeat with the newest progress now (after any queued
        events) and waits up to timeout_s until it was written to a
        welcomed stream: the last progress of a script that ends between
        two heartbeats reaches the daemon."""
        with self._cv:
            if not self._started or self._stopping:
                return False
            self._flush_generation += 1
            generation = self._flush_generation
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._flush_written >= generation or self._finished, timeout_s)
            return self._flush_written >= generation

    @property
    def progress_counter(self):
        with self._cv:
            return self._progress_counter

    @property
    def connected(self):
        with self._cv:
            return self._conn is not None and self._conn.welcomed

    @property
    def dropped_events(self):
        with self._cv:
            return self._dropped_events

    def send_event(self, event):
        with self._cv:
            self._events.append(event)
            while len(self._events) > MAX_QUEUED_EVENTS:
                self._events.popleft()
                self._dropped_events += 1
                self._popped_events += 1
            self._cv.notify_all()

    def report_exit(self, report, timeout_s):
        """Queues the exit report after any queued events; waits up to
        timeout_s until it was written to a welcomed stream."""
        with self._cv:
            if not self._started or self._stopping:
                return False
            self._exit_report = report
            self._exit_generation += 1
            generation = self._exit_generation
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._exit_written >= generation or self._finished, timeout_s)
            return self._exit_written >= generation

    def take_checkpoint_request(self):
        with self._cv:
            requested = self.checkpoint_requested
            self.checkpoint_requested = False
            return requested

    def stop(self):
        """Half-closes the stream (cancels it if the daemon does not end it
        promptly) and joins the thread. Idempotent."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
            # The request generator returns (a half-close); the daemon
            # normally ends the stream then. A call it keeps open, or a
            # connect that hangs, ends only when cancelled.
            if not self._cv.wait_for(lambda: self._finished or not self._started,
                                     _HALF_CLOSE_GRACE_S):
                if self._conn is not None and self._conn.call is not None:
                    self._conn.call.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(_STOP_GRACE_S)

    # The link thread.

    def _run(self):
        backoff_s = self._reconnect_initial_s
        try:
            while True:
                refusal = None
                try:
                    welcomed, refusal = self._run_connection()
                except Exception:
                    # A bug here or a surprise from grpc or protobuf must not
                    # end the thread: the script would train on without
                    # heartbeats until the daemon killed it as frozen.
                    welcomed = False
                    sys.stderr.write("trainsup: the link to trainsupd failed, reconnecting:\n" +
                                     traceback.format_exc())
                    sys.stderr.flush()
                if refusal is not None:
                    if self._on_refused is not None:
                        self._on_refused(refusal)
                    break
                if welcomed:
                    backoff_s = self._reconnect_initial_s
                with self._cv:
                    if self._cv.wait_for(lambda: self._stopping, backoff_s):
                        break
                backoff_s = min(backoff_s * 2, self._reconnect_max_s)
        finally:
            with self._cv:
                self._finished = True
                self._cv.notify_all()

    def _channel_options(self):
        ms = lambda s: max(1, int(s * 1000))
        # A channel per connection with its own subchannel pool and our
        # backoff, as in link.cc: gRPC's shared subchannels would add their
        # own reconnect delays.
        return [("grpc.use_local_subchannel_pool", 1),
                ("grpc.initial_reconnect_backoff_ms", ms(self._reconnect_initial_s)),
                ("grpc.min_reconnect_backoff_ms", ms(self._reconnect_initial_s)),
                ("grpc.max_reconnect_backoff_ms", ms(self._reconnect_max_s))]

    def _run_connection(self):
        conn = _Connection()
        with self._cv:
            if self._stopping:
                return False, None
            self._conn = conn
        channel = self._grpc.insecure_channel(self._endpoint, options=self._channel_options())
        try:
            stub = self._wgrpc.WorkerChannelStub(channel)
            conn.call = stub.Connect(self._requests(conn))
            try:
                for command in conn.call:
                    self._handle_command(conn, command)
            except self._grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else None
                with self._cv:
                    if (code == self._grpc.StatusCode.FAILED_PRECONDITION and not conn.welcomed
                            and not self._stopping):
                        conn.refusal = e.details() or str(code)
        finally:
            with self._cv:
                conn.ended = True
                welcomed = conn.welcomed
                self._conn = None
                self._cv.notify_all()
            if conn.call is not None:
                conn.call.cancel()
            channel.close()
        return welcomed, conn.refusal

    def _requests(self, conn):
        """The stream's messages. gRPC asks for the next one only after the
        previous one was written, so resuming here acknowledges it."""
        hello = self._wpb.WorkerMessage()
        hello.hello.run_id = self._run_id
        hello.hello.rank = self._rank
        hello.hello.attempt = self._attempt
        hello.hello.pid = os.getpid()
        hello.hello.token = self._token
        hello.hello.world_size = self._world_size
        hello.hello.version = self._version
        yield hello
        next_heartbeat = time.monotonic()
        while True:
            event_id = -1
            exit_generation = 0
            flush_generation = 0
            with self._cv:
                while True:
                    if self._stopping or conn.ended:
                        return
                    # Nothing but the Hello before the daemon accepted it:
                    # events written to a stream it rejects would be lost.
                    if not conn.welcomed:
                        self._cv.wait()
                        continue
                    if self._events:
                        message = self._wpb.WorkerMessage()
                        message.event.CopyFrom(self._events[0])
                        event_id = self._popped_events
                        break
                    if self._exit_report is not None and self._exit_written < self._exit_generation:
                        message = self._wpb.WorkerMessage()
                        message.exit.CopyFrom(self._exit_report)
                        exit_generation = self._exit_generation
                        break
                    now = time.monotonic()
                    if self._flush_written < self._flush_generation:
                        message = self._make_heartbeat()
                        flush_generation = self._flush_generation
                        next_heartbeat = now + self._interval_s
                        break
                    if now >= next_heartbeat:
                        message = self._make_heartbeat()
                        next_heartbeat = now + self._interval_s
                        break
                    self._cv.wait(next_heartbeat - now)
            yield message
            with self._cv:
                # The event may have been dropped from the full queue while
                # it was being written; pop it only if it is still first.
                if event_id >= 0 and event_id == self._popped_events and self._events:
                    self._events.popleft()
                    self._popped_events += 1
                if exit_generation > 0:
                    self._exit_written = max(self._exit_written, exit_generation)
                    self._cv.notify_all()
                if flush_generation > 0:
                    self._flush_written = max(self._flush_written, flush_generation)
                    self._cv.notify_all()

    def _make_heartbeat(self):
        message = self._wpb.WorkerMessage()
        self._heartbeat_seq += 1
        message.heartbeat.seq = self._heartbeat_seq
        message.heartbeat.progress_counter = self._progress_counter
        message.heartbeat.progress.CopyFrom(self._progress)
        message.heartbeat.progress.time_ms = int(time.time() * 1000)
        return message

    def _handle_command(self, conn, command):
        kind = command.WhichOneof("body")
        with self._cv:
            if kind == "welcome":
                if command.welcome.heartbeat_interval_ms > 0:
                    self._interval_s = command.welcome.heartbeat_interval_ms / 1000.0
                if not conn.welcomed:
                    conn.welcomed = True
                    self.connects += 1
            elif kind == "checkpoint_now":
                self.checkpoint_requested = True
            elif kind == "stop":
                self.stop_deadline_s = command.stop.deadline_s
                self.stop_reason = command.stop.reason
                self.stop_requested = True
            self._cv.notify_all()
