"""Tests of python/trainsup (docs/python-client.md). Run by ctest with
the python3 of the tests' virtual environment, where the client is installed
from its wheel (python/CMakeLists.txt), with no PYTHONPATH:

  build/python/venv/bin/python3 -m unittest discover -s tests/python -p '*_test.py'

Each scenario runs a real script in a child python3 process, as trainsupd
would start it; the channel tests serve WorkerChannel from this process with
grpcio (a stand-in for trainsupd's side: it records what the client sends
and sends Welcome, CheckpointNow and Stop), so they check the client's half
of the protocol: Hello fields, heartbeats whose progress_counter only
progress() advances, events, the exit report and the exit file."""

import json
import os
import queue
import select
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest
from concurrent import futures

import grpc
import trainsup
from trainsup.v1 import worker_pb2, worker_pb2_grpc, supervisor_pb2

PYTHON = sys.executable
# The installed client's version is the repository's (VERSION, read by the
# package's build).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "VERSION")) as _f:
    REPO_VERSION = _f.read().strip()
ENV_VARS = ("TRAINSUP_SUPERVISOR", "TRAINSUP_TOKEN", "TRAINSUP_RUN_ID", "TRAINSUP_ATTEMPT",
            "TRAINSUP_RUN_DIR", "TRAINSUP_CHECKPOINT_DIR", "TRAINSUP_RESUME_FROM",
            "TRAINSUP_CLIENT_PID", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
            "TRAINSUP_SKIP_WINDOWS", "TRAINSUP_LR_FACTOR")


def clean_env(**extra):
    # The installed client, never a source tree on PYTHONPATH.
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS + ("PYTHONPATH",)}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def read_until(pipe, done, timeout=20):
    """Reads `pipe` (a child's text pipe, not read from before) until
    done(text so far) or `timeout` s pass or it closes; the text."""
    fd = pipe.fileno()
    data = b""
    deadline = time.monotonic() + timeout
    while not done(data.decode(errors="replace")):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


def run_script(body, env, cwd, timeout=60):
    """Runs `body` as the file CWD/script.py (a file, so that spawned
    multiprocessing children can import its functions)."""
    path = os.path.join(cwd, "script.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(body))
    return subprocess.run([PYTHON, path], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


# A training loop on the CPU in mixed precision, for the scripts below:
# fp16 autocast with a real torch.amp.GradScaler whose first scale is
# INIT_SCALE (2**24 overflows fp16's gradients for a few steps, until the
# scaler has halved it far enough), checked by trainsup.Guard(GUARD_ARGS).
# Prints "step S applied|skipped scale X" and, at the end, the guard's
# overflow count. Exits 3 where the CPU build cannot autocast to fp16.
FP16_LOOP = """
import sys, torch, trainsup
torch.manual_seed(0)
try:
    with torch.autocast("cpu", dtype=torch.float16):
        torch.ones(2, 2) @ torch.ones(2, 2)
except RuntimeError as e:
    print("no fp16 autocast on this CPU build: %s" % e)
    sys.exit(3)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE)
guard = trainsup.Guard(GUARD_ARGS)
x, y = torch.randn(32, 8), torch.randn(32, 1)
for step in range(1, STEPS + 1):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    assert out.dtype == torch.float16
    loss = ((out.float() - y) ** 2).mean()
    scaler.scale(loss).backward()
    before = [p.detach().clone() for p in model.parameters()]
    scale = scaler.get_scale()
    if guard.check(step, loss, model, scaler=scaler):
        scaler.step(optimizer)
        scaler.update()
    changed = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    print("step %d %s scale %g" % (step, "applied" if changed else "skipped", scale), flush=True)
print("overflow steps %d" % guard.overflow_steps)
"""


def fp16_loop(init_scale, steps, guard_args=""):
    return (FP16_LOOP.replace("INIT_SCALE", repr(float(init_scale)))
            .replace("STEPS", str(steps)).replace("GUARD_ARGS", guard_args))


class NoOpOutsideTrainsupd(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="trainsup-py-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_same_script_runs_by_hand(self):
        r = run_script("""
            import os, threading, trainsup
            assert not trainsup.supervised()
            assert trainsup.resume_path() is None and trainsup.resume_step() is None
            assert trainsup.load_checkpoint() is None
            trainsup.phase("loading")
            for step in range(1, 4):
                trainsup.progress(step, loss=1.0 / step, samples_per_s=10, total_steps=3)
            assert not trainsup.stop_requested() and not trainsup.checkpoint_requested()
            with trainsup.checkpoint(3) as d:
                open(os.path.join(d, "w.bin"), "wb").write(b"x" * 100)
            # No link thread: nothing talks to a daemon.
            assert [t.name for t in threading.enumerate()] == ["MainThread"], threading.enumerate()
            print("ok", sorted(os.listdir("checkpoints")), sorted(os.listdir("checkpoints/step-3")))
            """, clean_env(), self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("ok ['step-3'] ['MANIFEST.json', 'w.bin']", r.stdout)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "attempts")))

    def test_the_installed_package_has_the_repository_version(self):
        r = run_script("""
            import trainsup, trainsup.v1.worker_pb2
            print(trainsup.__version__, trainsup.__file__)
            """, clean_env(), self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        version, path = r.stdout.split()
        self.assertEqual(version, REPO_VERSION)
        # Installed, not the source tree's python/trainsup.
        self.assertIn("site-packages", path)

    def test_failed_block_leaves_nothing(self):
        r = run_script("""
            import os, trainsup
            try:
                with trainsup.checkpoint(5, root="ck") as d:
                    open(os.path.join(d, "half"), "wb").write(b"y")
                    raise RuntimeError("disk on fire")
            except RuntimeError:
                pass
            print(sorted(os.listdir("ck")))
            """, clean_env(), self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "[]")

    def test_subdirectory_is_refused(self):
        r = run_script("""
            import os, trainsup
            with trainsup.checkpoint(1, root="ck") as d:
                os.mkdir(os.path.join(d, "sub"))
            """, clean_env(), self.dir)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("is not a regular file", r.stderr)
        self.assertEqual(os.listdir(os.path.join(self.dir, "ck")), [])

    def test_oom_exits_75(self):
        r = run_script("""
            import trainsup
            with trainsup.exit_on_oom():
                raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")
            """, clean_env(), self.dir)
        self.assertEqual(r.returncode, 75, r.stderr)
        self.assertIn("can't allocate memory", r.stderr)
        r = run_script("""
            import trainsup
            @trainsup.exit_on_oom()
            def f():
                raise MemoryError()
            f()
            """, clean_env(), self.dir)
        self.assertEqual(r.returncode, 75, r.stderr)
        # torch 2.x's name and 1.13's, by type (a message without the
        # words the string match looks for).
        for name in ("torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError"):
            r = run_script("""
                import torch, trainsup
                with trainsup.exit_on_oom():
                    raise %s("allocation refused (injected)")
                """ % name, clean_env(), self.dir)
            self.assertEqual(r.returncode, 75, name + ": " + r.stderr)
            self.assertIn("allocation refused", r.stderr)
        # Not an out-of-memory error: passes through.
        r = run_script("""
            import trainsup
            with trainsup.exit_on_oom():
                raise RuntimeError("shape mismatch")
            """, clean_env(), self.dir)
        self.assertEqual(r.returncode, 1)
        self.assertIn("shape mismatch", r.stderr)

    def test_guard_rejects_non_finite_and_spikes_then_diverges_with_79(self):
        # A real torch model: a NaN loss, a NaN gradient under a finite loss,
        # a spike after the warm-up, and the third bad step within the
        # window ends the process with exit 79 and the exit file's
        # first_bad_step (TRAINSUP_RUN_DIR set, as trainsupd sets it).
        r = run_script("""
            import math, torch, trainsup
            model = torch.nn.Linear(2, 1)
            guard = trainsup.Guard(max_bad_steps=3, bad_window=10, spike_factor=4,
                                   spike_window=5, spike_warmup=5)
            def step(loss_value):
                model.zero_grad()
                loss = model(torch.ones(1, 2)).sum() * 0 + loss_value
                loss.backward()
                return loss
            for s in range(1, 6):
                assert guard.check(s, step(1.0), model), s
            assert not guard.check(6, step(float("nan")), model)
            loss = torch.tensor(1.0)
            model.weight.grad = torch.full_like(model.weight, float("nan"))
            assert not guard.check(7, loss, model)
            assert guard.check(8, 3.9)
            print("before the third", flush=True)
            guard.check(9, 50.0)
            print("not reached", flush=True)
            """, clean_env(TRAINSUP_RUN_DIR=self.dir, TRAINSUP_ATTEMPT=1), self.dir)
        self.assertEqual(r.returncode, 79, r.stderr)
        self.assertIn("before the third", r.stdout)
        self.assertNotIn("not reached", r.stdout)
        self.assertIn("step 6 not applied (not finite): loss nan", r.stderr)
        self.assertIn("step 7 not applied (not finite): gradient norm not finite", r.stderr)
        self.assertIn("step 9 not applied (loss spike): loss 50 is 50.0 times the median 1", r.stderr)
        with open(os.path.join(self.dir, "attempts", "1", "rank-0.exit.json")) as f:
            exit_file = json.load(f)
        self.assertEqual(exit_file["code"], 79)
        self.assertEqual(exit_file["reason"], "diverged")
        self.assertEqual(exit_file["first_bad_step"], 6)
        self.assertTrue(exit_file["message"].startswith(
            "diverged at step 6: 3 bad steps within 10 (step 6: loss nan; "), exit_file["message"])

    def test_guard_counts_scaler_overflows_apart_from_bad_steps(self):
        # fp16 with a real GradScaler: its routine overflows are skipped by
        # scaler.step and counted as overflows, never as bad steps (three
        # bad steps would have ended the script with 79); training goes on
        # once the scale has come down.
        r = run_script(fp16_loop(2 ** 24, 14), clean_env(TRAINSUP_RUN_DIR=self.dir,
                                                         TRAINSUP_ATTEMPT=1), self.dir)
        if r.returncode == 3:
            self.skipTest(r.stdout)
        self.assertEqual(r.returncode, 0, r.stderr)
        skipped = [l for l in r.stdout.splitlines() if " skipped " in l]
        applied = [l for l in r.stdout.splitlines() if " applied " in l]
        self.assertGreaterEqual(len(skipped), 3, r.stdout)
        self.assertGreaterEqual(len(applied), 3, r.stdout)
        self.assertIn("overflow steps %d" % len(skipped), r.stdout)
        self.assertTrue(r.stdout.index(applied[0]) > r.stdout.index(skipped[-1]), r.stdout)
        self.assertIn("step 1 skipped by the loss scaler: gradient overflow at scale 1.67772e+07, "
                      "the scale goes to 8.38861e+06", r.stderr)
        self.assertNotIn("not applied", r.stderr)

    def test_guard_under_bf16_autocast_has_no_scaler_and_judges_as_in_fp32(self):
        r = run_script("""
            import torch, trainsup
            torch.manual_seed(0)
            model = torch.nn.Linear(8, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            guard = trainsup.Guard(max_bad_steps=2, bad_window=10)
            x, y = torch.randn(16, 8), torch.randn(16, 1)
            for step in range(1, 5):
                optimizer.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = model(x)
                assert out.dtype == torch.bfloat16
                loss = ((out.float() - y) ** 2).mean()
                loss.backward()
                if step == 3:
                    model.weight.grad[0, 0] = float("inf")
                print(step, guard.check(step, loss, model), flush=True)
            """, clean_env(), self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["1", "True", "2", "True", "3", "False", "4", "True"])
        self.assertIn("step 3 not applied (not finite): gradient norm not finite", r.stderr)

    def test_overflows_in_a_row_are_divergence_and_exit_79(self):
        # 2**40 overflows for many steps: the third in a row is divergence,
        # named from the first, as a bad step's would be.
        r = run_script(fp16_loop(2 ** 40, 10, "max_overflow_streak=3"),
                       clean_env(TRAINSUP_RUN_DIR=self.dir, TRAINSUP_ATTEMPT=1), self.dir)
        if r.returncode == 3:
            self.skipTest(r.stdout)
        self.assertEqual(r.returncode, 79, r.stderr)
        self.assertIn("step 2 skipped scale", r.stdout)
        self.assertNotIn("step 3 ", r.stdout)
        with open(os.path.join(self.dir, "attempts", "1", "rank-0.exit.json")) as f:
            exit_file = json.load(f)
        self.assertEqual((exit_file["code"], exit_file["reason"], exit_file["first_bad_step"]),
                         (79, "diverged", 1))
        self.assertTrue(exit_file["message"].startswith(
            "diverged at step 1: the loss scaler overflowed at every step since (3 overflows in "
            "a row;"), exit_file["message"])

    def test_a_scale_below_the_floor_is_divergence(self):
        r = run_script(fp16_loop(2 ** 24, 10, "min_scale=2.0 ** 23 + 1"),
                       clean_env(TRAINSUP_RUN_DIR=self.dir, TRAINSUP_ATTEMPT=1), self.dir)
        if r.returncode == 3:
            self.skipTest(r.stdout)
        self.assertEqual(r.returncode, 79, r.stderr)
        self.assertIn("the scale would fall to 8.38861e+06, below min_scale 8.38861e+06",
                      r.stderr)

    def test_retention_keeps_the_checkpoint_before_a_counted_bad_step(self):
        # keep_last=2: a bad step at 5 keeps step-4, a rollback's target,
        # past the newest two.
        r = run_script("""
            import os, trainsup
            guard = trainsup.Guard(max_bad_steps=3, bad_window=100)
            for step in range(1, 11):
                guard.check(step, float("nan") if step == 5 else 1.0)
                with trainsup.checkpoint(step, root="ckpt", keep_last=2) as d:
                    open(os.path.join(d, "x"), "w").write(str(step))
            print(sorted(int(n.split("-")[1]) for n in os.listdir("ckpt")))
            """, clean_env(), self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("[4, 9, 10]", r.stdout)

    def test_skip_windows_and_lr_factor_come_from_the_environment(self):
        r = run_script("""
            import trainsup
            assert trainsup.skip_windows() == [(6, 8), (20, 20)], trainsup.skip_windows()
            assert [s for s in range(1, 25) if trainsup.skip_step(s)] == [6, 7, 8, 20]
            assert trainsup.lr_factor() == 0.25
            print("ok")
            """, clean_env(TRAINSUP_SKIP_WINDOWS="6-8,20-20", TRAINSUP_LR_FACTOR="0.25"),
            self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run_script("""
            import trainsup
            assert trainsup.skip_windows() == [] and not trainsup.skip_step(3)
            assert trainsup.lr_factor() == 1.0
            """, clean_env(), self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run_script("""
            import trainsup
            trainsup.skip_windows()
            """, clean_env(TRAINSUP_SKIP_WINDOWS="8-6"), self.dir)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("TRAINSUP_SKIP_WINDOWS: '8-6' is not FIRST-LAST", r.stderr)

    def test_rank_1_writes_nothing(self):
        r = run_script("""
            import os, trainsup
            with trainsup.checkpoint(2, root="ck") as d:
                open(os.path.join(d, "w"), "wb").write(b"z")
            assert trainsup.save_checkpoint(2, {"a": 1}, root="ck") is None
            print(os.path.exists("ck"))
            """, clean_env(RANK=1, WORLD_SIZE=2), self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "False")


class FakeDaemon(worker_pb2_grpc.WorkerChannelServicer):
    """Records every message; sends Welcome, then whatever commands the
    test puts into `commands`."""

    def __init__(self, token, heartbeat_interval_ms=50):
        self.token = token
        self.refuse = None  # a message: refuse every Hello as trainsupd refuses a version
        self.interval = heartbeat_interval_ms
        self.messages = queue.Queue()
        self.commands = queue.Queue()
        self.connections = 0

    def Connect(self, request_iterator, context):
        first = next(request_iterator)
        self.messages.put(first)
        if first.hello.token != self.token:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad token")
        if self.refuse is not None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, self.refuse)
        self.connections += 1
        yield worker_pb2.SupervisorCommand(
            welcome=worker_pb2.Welcome(heartbeat_interval_ms=self.interval))
        done = threading.Event()

        def read():
            try:
                for m in request_iterator:
                    self.messages.put(m)
            except grpc.RpcError:
                pass
            done.set()

        threading.Thread(target=read, daemon=True).start()
        while not done.is_set():
            try:
                yield self.commands.get(timeout=0.05)
            except queue.Empty:
                pass


class Channel(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="trainsup-py-")
        self.socket = os.path.join(self.dir, "w.sock")
        self.daemon = FakeDaemon("secret")
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        worker_pb2_grpc.add_WorkerChannelServicer_to_server(self.daemon, self.server)
        self.server.add_insecure_port("unix:" + self.socket)
        self.server.start()
        self.run_dir = os.path.join(self.dir, "run")
        os.makedirs(self.run_dir)

    def tearDown(self):
        self.server.stop(0)
        shutil.rmtree(self.dir, ignore_errors=True)

    def env(self, **extra):
        return clean_env(TRAINSUP_SUPERVISOR="unix:" + self.socket, TRAINSUP_TOKEN="secret",
                         TRAINSUP_RUN_ID="run-7", TRAINSUP_ATTEMPT=2,
                         TRAINSUP_RUN_DIR=self.run_dir,
                         TRAINSUP_CHECKPOINT_DIR=os.path.join(self.run_dir, "checkpoints"),
                         TRAINSUP_RESUME_FROM="", RANK=0, WORLD_SIZE=1, **extra)

    def messages(self):
        out = []
        while True:
            try:
                out.append(self.daemon.messages.get_nowait())
            except queue.Empty:
                return out

    def wait_for(self, predicate, timeout=20):
        """Messages up to and including the first that satisfies predicate."""
        seen = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                m = self.daemon.messages.get(timeout=0.1)
            except queue.Empty:
                continue
            seen.append(m)
            if predicate(m):
                return seen
        self.fail("no such message in %d s; saw %s" % (timeout, seen[-5:]))

    def test_hello_heartbeats_checkpoint_exit(self):
        script = subprocess.Popen([PYTHON, "-c", textwrap.dedent("""
            import os, sys, time, trainsup
            assert trainsup.supervised()
            for step in range(1, 4):
                trainsup.progress(step, loss=0.25, samples_per_s=8.0, total_steps=10)
            # Heartbeats go on while the loop does nothing, until the test
            # has seen three of them.
            sys.stdout.write("trained\\n"); sys.stdout.flush()
            sys.stdin.readline()
            with trainsup.checkpoint(3) as d:
                open(os.path.join(d, "model.bin"), "wb").write(b"m" * 1000)
            sys.stdout.write("go\\n"); sys.stdout.flush()
            sys.stdin.readline()
            trainsup.exit(143, message="stopped by the test")
            """)], env=self.env(), cwd=self.dir, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        try:
            self.assertEqual(script.stdout.readline().strip(), "trained")
            # Only progress() advances the counter: three beats while the
            # script waits all carry 3, in the training phase.
            quiet = []

            def third_quiet_beat(m):
                if m.HasField("heartbeat") and m.heartbeat.progress_counter == 3:
                    quiet.append(m.heartbeat)
                return len(quiet) == 3
            seen = self.wait_for(third_quiet_beat)
            hello = seen[0].hello
            self.assertEqual((hello.run_id, hello.rank, hello.attempt, hello.pid, hello.token,
                              hello.world_size, hello.version),
                             ("run-7", 0, 2, script.pid, "secret", 1, REPO_VERSION))
            self.assertEqual([b.progress.phase for b in quiet], [supervisor_pb2.PHASE_TRAINING] * 3)
            self.assertEqual(quiet[-1].progress.step, 3)
            self.assertEqual(quiet[-1].progress.total_steps, 10)
            self.assertAlmostEqual(quiet[-1].progress.loss, 0.25)
            self.assertGreater(quiet[-1].progress.time_ms, 0)
            script.stdin.write("\n")
            script.stdin.flush()
            self.assertEqual(script.stdout.readline().strip(), "go")
            seen += self.wait_for(lambda m: m.HasField("event"))
            beats = [m.heartbeat for m in seen if m.HasField("heartbeat")]
            # Checkpointing in the beats that came during the save.
            phases = [b.progress.phase for b in beats[len(quiet):]]
            self.assertTrue(set(phases) <= {supervisor_pb2.PHASE_TRAINING,
                                            supervisor_pb2.PHASE_CHECKPOINTING}, phases)
            self.assertEqual([b.seq for b in beats], list(range(1, len(beats) + 1)))
            event = seen[-1].event
            self.assertEqual((event.kind, event.step, event.checkpoint_step, event.error),
                             (supervisor_pb2.EVENT_KIND_CHECKPOINT, 3, 3, ""))
            self.assertTrue(os.path.isfile(
                os.path.join(self.run_dir, "checkpoints", "step-3", "MANIFEST.json")))
            script.stdin.write("\n")
            script.stdin.flush()
            seen = self.wait_for(lambda m: m.HasField("exit"))
            report = seen[-1].exit
            self.assertEqual((report.code, report.reason, report.message, report.last_step),
                             (143, "stopped", "stopped by the test", 3))
            self.assertEqual(script.wait(timeout=20), 143)
            with open(os.path.join(self.run_dir, "attempts", "2", "rank-0.exit.json")) as f:
                exit_file = json.load(f)
            self.assertEqual({k: exit_file[k] for k in ("code", "reason", "message", "last_step")},
                             {"code": 143, "reason": "stopped", "message": "stopped by the test",
                              "last_step": 3})
            self.assertGreater(exit_file["time_ms"], 0)
        finally:
            script.kill()
            script.communicate()

    def test_scaler_skips_reach_the_tally_and_events_not_the_bad_steps(self):
        r = run_script(fp16_loop(2 ** 24, 12), self.env(), self.dir)
        if r.returncode == 3:
            self.skipTest(r.stdout)
        self.assertEqual(r.returncode, 0, r.stderr)
        skipped = len([l for l in r.stdout.splitlines() if " skipped " in l])
        self.assertGreater(skipped, 0, r.stdout)
        messages = self.messages()
        guard_events = [m.event for m in messages
                        if m.HasField("event") and m.event.kind == supervisor_pb2.EVENT_KIND_GUARD]
        self.assertEqual(len(guard_events), skipped)
        self.assertTrue(all("skipped by the loss scaler" in e.message for e in guard_events))
        last = [m.heartbeat.progress for m in messages if m.HasField("heartbeat")][-1]
        self.assertEqual(last.tally.skipped_scaler, skipped)
        self.assertEqual((last.tally.skipped_guard, last.nonfinite_steps, last.spike_steps),
                         (0, 0, 0))

    def test_commands_reach_the_script(self):
        script = subprocess.Popen([PYTHON, "-c", textwrap.dedent("""
            import sys, time, trainsup
            trainsup.progress(1)
            deadline = time.monotonic() + 20
            while not trainsup.checkpoint_requested():
                assert time.monotonic() < deadline, "no CheckpointNow"
                time.sleep(0.02)
            assert not trainsup.checkpoint_requested()  # taken once
            print("checkpoint requested", flush=True)
            while not trainsup.stop_requested():
                assert time.monotonic() < deadline, "no Stop"
                time.sleep(0.02)
            print("stop", trainsup.stop_deadline_s(), flush=True)
            """)], env=self.env(), cwd=self.dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        try:
            self.wait_for(lambda m: m.HasField("heartbeat"))
            self.daemon.commands.put(
                worker_pb2.SupervisorCommand(checkpoint_now=worker_pb2.CheckpointNow()))
            self.assertEqual(script.stdout.readline().strip(), "checkpoint requested")
            self.daemon.commands.put(
                worker_pb2.SupervisorCommand(stop=worker_pb2.Stop(deadline_s=30, reason="test")))
            out, err = script.communicate(timeout=30)
            self.assertEqual(script.returncode, 0, err)
            self.assertEqual(out.strip(), "stop 30")
        finally:
            script.kill()
            script.communicate()

    def test_oom_reports_and_exits_75(self):
        r = run_script("""
            import trainsup
            trainsup.progress(4)
            with trainsup.exit_on_oom():
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
            """, self.env(), self.dir)
        self.assertEqual(r.returncode, 75, r.stderr)
        seen = self.wait_for(lambda m: m.HasField("exit"))
        self.assertEqual((seen[-1].exit.code, seen[-1].exit.reason, seen[-1].exit.last_step),
                         (75, "oom", 4))
        with open(os.path.join(self.run_dir, "attempts", "2", "rank-0.exit.json")) as f:
            self.assertEqual(json.load(f)["reason"], "oom")

    def test_a_version_the_daemon_refuses_ends_the_script_with_64(self):
        # trainsupd answers a Hello of a version it cannot serve with
        # FAILED_PRECONDITION: no reconnect mends it, so the client ends
        # the script with the usage exit and the daemon's message, instead
        # of training on unsupervised into a frozen kill.
        self.daemon.refuse = "worker version %s cannot be served by trainsupd 9.0.0" % REPO_VERSION
        r = run_script("""
            import time, trainsup
            trainsup.progress(2)
            time.sleep(60)
            print("still training")
            """, self.env(), self.dir, timeout=30)
        self.assertEqual(r.returncode, 64, r.stderr)
        self.assertNotIn("still training", r.stdout)
        self.assertIn("cannot be served by trainsupd 9.0.0", r.stderr)
        with open(os.path.join(self.run_dir, "attempts", "2", "rank-0.exit.json")) as f:
            exit_file = json.load(f)
        self.assertEqual((exit_file["code"], exit_file["reason"]), (64, "usage"))
        self.assertIn("trainsupd refused this client (trainsup %s): worker version" % REPO_VERSION,
                      exit_file["message"])
        self.assertEqual(self.daemon.connections, 0)

    def test_reconnects_when_the_daemon_comes_back(self):
        self.server.stop(0).wait()
        script = subprocess.Popen([PYTHON, "-c", textwrap.dedent("""
            import time, trainsup
            for step in range(1, 1000):
                trainsup.progress(step)
                if step == 20:
                    print("step 20", flush=True)
                time.sleep(0.02)
            """)], env=self.env(), cwd=self.dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        try:
            # The script trains without a daemon, past the counter the
            # assertion below needs.
            self.assertEqual(script.stdout.readline().strip(), "step 20")
            self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
            worker_pb2_grpc.add_WorkerChannelServicer_to_server(self.daemon, self.server)
            self.server.add_insecure_port("unix:" + self.socket)
            self.server.start()
            seen = self.wait_for(lambda m: m.HasField("heartbeat"))
            self.assertTrue(seen[0].HasField("hello"))
            self.assertGreater(seen[-1].heartbeat.progress_counter, 10)
        finally:
            script.kill()
            script.communicate()

    def test_an_unexpected_error_in_the_link_thread_reconnects(self):
        # The link thread must outlive a bug or a library's surprise: a dead
        # thread leaves the script training without heartbeats, and the
        # daemon kills it as frozen with nothing but a traceback to show.
        script = subprocess.Popen([PYTHON, "-c", textwrap.dedent("""
            import time, trainsup
            from trainsup import _link
            handle = _link.Link._handle_command
            failed = []

            def fail_once(self, conn, command):
                if not failed:
                    failed.append(1)
                    raise RuntimeError("injected link failure")
                return handle(self, conn, command)
            _link.Link._handle_command = fail_once
            for step in range(1, 1000):
                trainsup.progress(step)
                time.sleep(0.02)
            """)], env=self.env(), cwd=self.dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        try:
            seen = self.wait_for(lambda m: m.HasField("heartbeat"))
            hellos = [m for m in seen if m.HasField("hello")]
            self.assertEqual(len(hellos), 2, seen)
            self.assertEqual(self.daemon.connections, 2)
        finally:
            script.kill()
            _, err = script.communicate()
        self.assertIn("trainsup: the link to trainsupd failed", err)
        self.assertIn("RuntimeError: injected link failure", err)

    def test_sigusr1_dumps_python_stacks(self):
        script = subprocess.Popen([PYTHON, "-c", textwrap.dedent("""
            import time, trainsup
            def stuck_in_here():
                print("ready", flush=True)
                while True:
                    time.sleep(0.05)
            stuck_in_here()
            """)], env=self.env(), cwd=self.dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        try:
            self.assertEqual(script.stdout.readline().strip(), "ready")
            # Once the link thread has connected (its imports done): a dump
            # of all threads while another thread is mid-import may crash
            # the interpreter (faulthandler reads frames being torn down;
            # seen once as a cut-off dump). trainsupd signals only a rank
            # found hung, long after its start.
            self.wait_for(lambda m: m.HasField("heartbeat"))
            os.kill(script.pid, 10)  # SIGUSR1
            # Until the dump is there: a SIGTERM sent while the SIGUSR1 is
            # still pending kills the process before the handler runs.
            err = read_until(script.stderr,
                             lambda t: "stuck_in_here" in t and t.count("hread 0x") >= 2)
            script.terminate()
            err += script.communicate(timeout=20)[1]
            self.assertIn("stuck_in_here", err)
            # all_threads: the main thread and the link's (and gRPC's).
            self.assertGreaterEqual(err.count("hread 0x"), 2, err)
        finally:
            script.kill()
            script.communicate()

    def test_child_process_stays_silent(self):
        r = run_script("""
            import multiprocessing as mp, trainsup
            def child():
                import trainsup
                trainsup.progress(99)
                assert not trainsup.supervised()
            if __name__ == "__main__":
                trainsup.progress(1)
                ctx = mp.get_context("spawn")
                p = ctx.Process(target=child)
                p.start(); p.join()
                assert p.exitcode == 0, p.exitcode
                import time; time.sleep(0.3)
            """, self.env(), self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        hellos = [m for m in self.messages() if m.HasField("hello")]
        self.assertEqual(len(hellos), 1)

    def test_checkpoint_from_a_child_of_rank_0_goes_to_the_runs_store(self):
        # An async-checkpoint helper: a child of rank 0 (forked and spawned)
        # commits into TRAINSUP_CHECKPOINT_DIR, not ./checkpoints.
        r = run_script("""
            import multiprocessing as mp, os, trainsup
            def child(step):
                with trainsup.checkpoint(step) as d:
                    open(os.path.join(d, "model.bin"), "wb").write(b"m" * 100)
            if __name__ == "__main__":
                trainsup.progress(1)
                for method, step in (("fork", 5), ("spawn", 6)):
                    p = mp.get_context(method).Process(target=child, args=(step,))
                    p.start(); p.join()
                    assert p.exitcode == 0, (method, p.exitcode)
            """, self.env(), self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        store = os.path.join(self.run_dir, "checkpoints")
        for step in (5, 6):
            self.assertTrue(os.path.isfile(os.path.join(store, "step-%d" % step, "MANIFEST.json")),
                            (step, os.listdir(store) if os.path.isdir(store) else "no store"))
        self.assertFalse(os.path.exists(os.path.join(self.dir, "checkpoints")))

    def test_forked_child_exiting_leaves_the_parents_link_alone(self):
        # A child forked after import ends through sys.exit, so the atexit
        # handlers it inherited run in it: the parent's link is not its own.
        r = run_script("""
            import os, sys, trainsup
            trainsup.progress(1)
            pid = os.fork()
            if pid == 0:
                link = trainsup._the_client.link
                def flush(timeout_s):
                    open("child-flushed", "w").close()
                    return False
                link.flush = flush
                sys.exit(0)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, status
            trainsup.progress(2)
            """, self.env(), self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "child-flushed")),
                         "the child ran the parent's exit handler")
        hellos = [m for m in self.messages() if m.HasField("hello")]
        self.assertEqual(len(hellos), 1)


class StoreWriters(unittest.TestCase):
    """Issue 42, 11: writers that share a checkpoint store (a script and its
    async-checkpoint child) never delete each other's save in progress; a
    dead writer's leftover is removed by the next save."""

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="store_writers_")
        self.addCleanup(shutil.rmtree, self.root, True)

    def other_process(self, body):
        script = textwrap.dedent("""
            import os, sys
            from trainsup import _store
            store = _store.CheckpointStore(sys.argv[1])
            """) + textwrap.dedent(body)
        return subprocess.run([PYTHON, "-c", script, self.root], env=clean_env(),
                              capture_output=True, text=True, timeout=60)

    def test_another_writers_save_does_not_delete_one_in_progress(self):
        from trainsup import _store
        mine = _store.CheckpointStore(self.root)
        tmp = mine.begin(5)
        with open(os.path.join(tmp, "model.bin"), "wb") as f:
            f.write(b"m" * 1000)
        r = self.other_process("""
            tmp = store.begin(6)
            open(os.path.join(tmp, "opt.bin"), "wb").write(b"o")
            store.commit(6, tmp)
            """)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.isfile(os.path.join(tmp, "model.bin")),
                        "the other writer deleted this one's save: %s" % os.listdir(self.root))
        final = mine.commit(5, tmp)
        with open(os.path.join(final, "MANIFEST.json")) as f:
            manifest = json.load(f)
        self.assertEqual([e["name"] for e in manifest["files"]], ["model.bin"])
        self.assertEqual(sorted(os.listdir(self.root)), ["step-5", "step-6"])

    def test_the_same_step_from_two_live_writers_is_refused(self):
        from trainsup import _store
        mine = _store.CheckpointStore(self.root)
        tmp = mine.begin(9)
        r = self.other_process("""
            try:
                store.begin(9)
            except RuntimeError as e:
                print(e)
                sys.exit(3)
            """)
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn("another process is saving it", r.stdout)
        mine.abort(tmp)
        self.assertEqual(os.listdir(self.root), [])

    def test_a_dead_writers_leftover_goes_with_the_next_save(self):
        from trainsup import _store
        r = self.other_process("""
            tmp = store.begin(7)
            open(os.path.join(tmp, "model.bin"), "wb").write(b"m")
            os._exit(0)
            """)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("step-7.tmp", os.listdir(self.root))
        store = _store.CheckpointStore(self.root)
        tmp = store.begin(8)
        store.commit(8, tmp)
        self.assertEqual(sorted(os.listdir(self.root)), ["step-8"])


if __name__ == "__main__":
    unittest.main()
