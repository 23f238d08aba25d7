"""trainsup: the Python client for training scripts run by trainsupd.

    import trainsup
    state = trainsup.load_checkpoint()            # None on a fresh start
    for step in range(start, total):
        ...
        trainsup.progress(step, loss=loss.item())
        if step % 100 == 0 or trainsup.checkpoint_requested():
            trainsup.save_checkpoint(step, {"model": model.state_dict(), ...})

Under trainsupd (TRAINSUP_SUPERVISOR set) importing this module registers
faulthandler on SIGUSR1 (all threads' Python stacks to stderr, which is the
rank's log: the daemon sends SIGUSR1 before it kills a hung worker) and
starts the heartbeat thread at once, so the daemon hears from the script
while it is still loading. Outside trainsupd every call that talks to the
daemon is a no-op and checkpoints go to ./checkpoints (or the root passed
in), so the same script runs by hand. See docs/python-client.md.
"""

import atexit
import contextlib
import faulthandler
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import traceback

from trainsup import _store
from trainsup._version import __version__

__all__ = [
    "progress", "phase", "checkpoint", "save_checkpoint", "resume_path", "resume_step",
    "load_checkpoint", "exit_on_oom", "exit", "stop_requested", "checkpoint_requested",
    "handle_sigterm", "stop_deadline_s", "supervised", "EXIT_CODES", "Guard", "skip_windows",
    "skip_step", "lr_factor", "report_final", "__version__",
]

# The worker contract's exit codes and their exit-file reasons
# (contracts/exit_codes.h).
EXIT_CODES = {0: "completed", 64: "usage", 65: "data", 74: "no_space", 75: "oom",
              76: "peer_lost", 79: "diverged", 143: "stopped"}
_PHASES = ("loading", "training", "checkpointing", "evaluating")
_REPORT_EXIT_TIMEOUT_S = 2.0
_OOM_MESSAGES = ("out of memory", "DefaultCPUAllocator: can't allocate memory")


def _env_int(name, default):
    value = os.environ.get(name, "")
    if value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError("trainsup: environment variable %s=%r is not an integer" % (name, value))


class _Client:
    """The process's one client. Only the process that created it talks to
    the daemon: a child (a forked or spawned DataLoader worker inherits the
    environment) stays silent, see _OWNER_ENV."""

    def __init__(self):
        env = os.environ
        self.endpoint = env.get("TRAINSUP_SUPERVISOR", "")
        self.supervised = bool(self.endpoint)
        self.run_id = env.get("TRAINSUP_RUN_ID", "")
        self.token = env.get("TRAINSUP_TOKEN", "")
        self.attempt = _env_int("TRAINSUP_ATTEMPT", 1)
        self.run_dir = env.get("TRAINSUP_RUN_DIR", "")
        self.checkpoint_dir = env.get("TRAINSUP_CHECKPOINT_DIR", "")
        self.rank = _env_int("RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.last_step = -1
        self.sigterm = False
        self.link = None
        self.progress = None
        if self.supervised:
            from trainsup import _link
            self.link = _link.Link(self.endpoint, self.run_id or os.path.basename(self.run_dir),
                                   self.rank, self.attempt, self.world_size, self.token,
                                   __version__, on_refused=self.refused)
            self.progress = self.link._pb.Progress()
            self.progress.last_checkpoint_step = -1
            self.progress.val_miou = -1
            # What the run trained (docs/python-client.md, "SUCCEEDED means
            # trained"): counted from the checkpoint resumed from on, so a
            # resumed run's tally is its model's whole lineage.
            t = self.progress.tally
            t.steps = -1
            t.final_metric = -1
            t.baseline_metric = -1
            base = _read_tally(resume_path())
            t.skipped_window = base.get("skipped_window", 0)
            t.skipped_guard = base.get("skipped_guard", 0)
            t.skipped_scaler = base.get("skipped_scaler", 0)
            self.window_steps = set()
            self.progress.phase = self.link._pb.PHASE_LOADING
            self.link.update_progress(self.progress)
            self.link.start()
            atexit.register(self.at_exit)

    def refused(self, message):
        """The daemon refused this client for good (a version it cannot
        serve). Training on unsupervised would end in a frozen kill and a
        restart into the same refusal, so the process ends now with the
        usage exit (64): the run fails once, with the daemon's message."""
        message = "trainsupd refused this client (trainsup %s): %s" % (__version__, message)
        print("trainsup: " + message, file=sys.stderr)
        if self.run_dir:
            try:
                _store.write_exit_file(self.run_dir, self.attempt, self.rank, 64, "usage", message,
                                       self.last_step, -1)
            except OSError as e:
                print("trainsup: cannot write the exit file: %s" % e, file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(64)

    def at_exit(self):
        """A script that returns normally: its last progress is flushed to
        the daemon (which judges the exit by its status) and the stream is
        closed. exit() and exit_on_oom() end with os._exit, without this.
        A forked child inherits the handler: the link is not its own, and
        its thread did not survive the fork, so it does nothing there."""
        if self.link is not None and os.getpid() == self.pid:
            self.link.flush(_REPORT_EXIT_TIMEOUT_S)
            self.link.stop()

    def update_tally(self):
        """tally.applied from the steps and the skips (caller holds self.lock)."""
        t = self.progress.tally
        if t.steps >= 0:
            t.applied = max(0, t.steps - t.skipped_window - t.skipped_guard - t.skipped_scaler)

    def publish(self):
        """Hands the current Progress to the link (caller holds self.lock)."""
        if self.link is not None:
            self.link.update_progress(self.progress)

    def send_checkpoint_event(self, step, error=""):
        if self.link is None:
            return
        pb = self.link._pb
        event = self.link._wpb.WorkerEvent()
        event.kind = pb.EVENT_KIND_CHECKPOINT
        event.step = step
        with self.lock:
            if error:
                self.progress.checkpoint_failures += 1
                self.progress.last_checkpoint_error = error
            else:
                self.progress.last_checkpoint_step = step
                self.progress.last_checkpoint_error = ""
            event.checkpoint_step = self.progress.last_checkpoint_step
            self.publish()
        event.error = error
        self.link.send_event(event)

    def report_exit(self, code, reason, message, first_bad_step=-1):
        """Exit file first (it survives a daemon restart), then ExitReport."""
        if self.run_dir:
            try:
                _store.write_exit_file(self.run_dir, self.attempt, self.rank, code, reason, message,
                                       self.last_step, first_bad_step)
            except OSError as e:
                print("trainsup: cannot write the exit file: %s" % e, file=sys.stderr)
        if self.link is not None:
            report = self.link._wpb.ExitReport(code=code, reason=reason, message=message,
                                               last_step=self.last_step,
                                               first_bad_step=first_bad_step)
            self.link.report_exit(report, _REPORT_EXIT_TIMEOUT_S)

    def send_guard_step(self, step, spike, line):
        """A step the script's Guard did not apply: counted in the
        heartbeat's Progress and sent as a GUARD event."""
        if self.link is None:
            return
        with self.lock:
            if spike:
                self.progress.spike_steps += 1
            else:
                self.progress.nonfinite_steps += 1
            self.progress.tally.skipped_guard += 1
            self.update_tally()
            self.publish()
        self.send_guard_event(step, line)

    def send_guard_event(self, step, line):
        event = self.link._wpb.WorkerEvent()
        event.kind = self.link._pb.EVENT_KIND_GUARD
        event.step = int(step)
        event.checkpoint_step = -1
        event.message = line
        self.link.send_event(event)


    def send_scaler_skip(self, step, line):
        """A step the loss scaler skipped on an overflow: counted in the
        run's tally (skipped_scaler) and sent as a GUARD event, never as a
        bad step (nonfinite_steps and spike_steps stay)."""
        if self.link is None:
            return
        with self.lock:
            self.progress.tally.skipped_scaler += 1
            self.update_tally()
            self.publish()
        self.send_guard_event(step, line)


# Set to the pid of the process whose client talks to the daemon; a child
# process that inherits it stays silent instead of sending a second Hello
# with its parent's token and rank.
_OWNER_ENV = "TRAINSUP_CLIENT_PID"
_client_lock = threading.Lock()
_the_client = None
_the_client_pid = None


def _client():
    """The client of this process; None in a child of the owning process."""
    global _the_client, _the_client_pid
    with _client_lock:
        pid = os.getpid()
        if _the_client is not None and _the_client_pid == pid:
            return _the_client
        owner = os.environ.get(_OWNER_ENV, "")
        if owner and owner != str(pid):
            return None
        os.environ[_OWNER_ENV] = str(pid)
        _the_client = _Client()
        _the_client_pid = pid
        return _the_client


def supervised():
    """True when this process runs under trainsupd and talks to it."""
    c = _client()
    return c is not None and c.supervised


def progress(step, loss=None, samples_per_s=None, total_steps=None, epoch=None, lr=None):
    """Reports that training step `step` is done: advances the progress
    counter that the daemon's hang detection watches (only this call does)
    and updates the Progress sent with the next heartbeats. Sets the phase
    to "training". `loss` and `lr` (the step's learning rate) go to the
    daemon's /metrics as trainsup_worker_loss and
    trainsup_worker_learning_rate. No-op outside trainsupd."""
    c = _client()
    if c is None:
        return
    with c.lock:
        c.last_step = int(step)
        if c.link is None:
            return
        p = c.progress
        p.step = int(step)
        p.phase = c.link._pb.PHASE_TRAINING
        if loss is not None:
            p.loss = float(loss)
        if samples_per_s is not None:
            p.samples_per_sec = float(samples_per_s)
        if lr is not None:
            p.learning_rate = float(lr)
        if total_steps is not None:
            p.total_steps = int(total_steps)
        if epoch is not None:
            p.epoch = int(epoch)
        p.tally.steps = int(step)
        c.update_tally()
        c.publish()
        c.link.advance_progress()


def phase(name):
    """Reports the phase: "loading", "training", "checkpointing" or
    "evaluating". Does not advance the progress counter."""
    if name not in _PHASES:
        raise ValueError("trainsup.phase: unknown phase %r; one of %s" % (name, ", ".join(_PHASES)))
    c = _client()
    if c is None or c.link is None:
        return
    with c.lock:
        c.progress.phase = c.link._pb.Phase.Value("PHASE_" + name.upper())
        c.publish()


def _checkpoint_root(c, root):
    # A child of the owning process (c is None: an async-checkpoint helper,
    # say) runs under trainsupd too: the environment the daemon set names
    # the run's store.
    if c is not None:
        supervised, checkpoint_dir = c.supervised, c.checkpoint_dir
    else:
        supervised = bool(os.environ.get("TRAINSUP_SUPERVISOR", ""))
        checkpoint_dir = os.environ.get("TRAINSUP_CHECKPOINT_DIR", "")
    if supervised:
        if not checkpoint_dir:
            raise RuntimeError("trainsup: TRAINSUP_CHECKPOINT_DIR is not set by the supervisor")
        return checkpoint_dir
    return root if root is not None else os.path.join(os.getcwd(), "checkpoints")


@contextlib.contextmanager
def checkpoint(step, root=None, keep_last=3, keep_every=0):
    """with trainsup.checkpoint(step) as d: write regular files into d.

    On a normal exit from the block the checkpoint is committed atomically
    with MANIFEST.json (ROOT/step-N, docs/checkpoints.md), retention keeps
    the newest `keep_last` (None: all) and every multiple of `keep_every`,
    and a CHECKPOINT event goes to the daemon. On an exception the directory
    is removed, a CHECKPOINT event with the error is sent and the exception
    propagates. ROOT is TRAINSUP_CHECKPOINT_DIR under trainsupd (`root` is
    then ignored), in a child process of the script too, else `root` or
    ./checkpoints. A child's checkpoint sends no event (only the script's
    own process talks to the daemon); the daemon verifies it on disk like
    any other. On a rank other than 0 the block gets a scratch directory
    that is discarded: a gang has one store, which rank 0 writes."""
    c = _client()
    rank = c.rank if c is not None else _env_int("RANK", 0)
    if rank != 0:
        scratch = tempfile.mkdtemp(prefix="trainsup-rank%d-step%d-" % (rank, step))
        try:
            yield scratch
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return
    store = _store.CheckpointStore(_checkpoint_root(c, root), keep_last=keep_last,
                                   keep_every=keep_every, keep_before=_keep_before)
    previous_phase = None
    if c is not None and c.link is not None:
        with c.lock:
            previous_phase = c.progress.phase
            c.progress.phase = c.link._pb.PHASE_CHECKPOINTING
            c.publish()
    try:
        tmp = store.begin(step)
        try:
            yield tmp
            if c is not None and c.link is not None:
                with c.lock:
                    t = c.progress.tally
                    counts = {"skipped_window": t.skipped_window,
                              "skipped_guard": t.skipped_guard,
                              "skipped_scaler": t.skipped_scaler}
                with open(os.path.join(tmp, _TALLY_FILE), "w") as f:
                    json.dump(counts, f)
        except BaseException:
            store.abort(tmp)
            raise
        store.commit(step, tmp)
    except BaseException as e:
        if c is not None and not isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            c.send_checkpoint_event(step, error="%s: %s" % (type(e).__name__, e))
        raise
    finally:
        if previous_phase is not None:
            with c.lock:
                c.progress.phase = previous_phase
                c.publish()
    if c is not None:
        c.send_checkpoint_event(step)


def save_checkpoint(step, obj, name="state.pt", root=None, keep_last=3, keep_every=0):
    """torch.save(obj) into checkpoint `step` as `name`, committed as
    checkpoint() does. Returns the committed directory, or None on a rank
    other than 0 (nothing is written there)."""
    c = _client()
    rank = c.rank if c is not None else _env_int("RANK", 0)
    if rank != 0:
        return None
    if "/" in name or name in ("", ".", "..", _store.MANIFEST_NAME):
        raise ValueError("trainsup.save_checkpoint: invalid file name %r" % (name,))
    import torch
    with checkpoint(step, root=root, keep_last=keep_last, keep_every=keep_every) as d:
        torch.save(obj, os.path.join(d, name))
    return os.path.join(_checkpoint_root(c, root), _store.step_dir_name(step))


def resume_path():
    """The checkpoint directory to resume from (TRAINSUP_RESUME_FROM: the
    newest checkpoint trainsupd verified), or None on a fresh start. Read
    outside trainsupd too, so a run by hand can be pointed at one."""
    path = os.environ.get("TRAINSUP_RESUME_FROM", "")
    return path or None


def resume_step():
    """The step of resume_path()'s checkpoint (from its MANIFEST.json), or
    None on a fresh start."""
    path = resume_path()
    if path is None:
        return None
    import json
    with open(os.path.join(path, _store.MANIFEST_NAME), "rb") as f:
        return int(json.load(f)["step"])


def load_checkpoint(name="state.pt", map_location="cpu"):
    """torch.load of `name` in resume_path(), or None on a fresh start."""
    path = resume_path()
    if path is None:
        return None
    import torch
    return torch.load(os.path.join(path, name), map_location=map_location)


def _is_oom(e):
    if isinstance(e, MemoryError):
        return True
    torch = sys.modules.get("torch")
    if torch is not None:
        # torch 2.x raises torch.OutOfMemoryError (CUDA and CPU); 1.13 had
        # only torch.cuda.OutOfMemoryError, which 2.x keeps as an alias.
        for owner in (torch, getattr(torch, "cuda", None)):
            oom_type = getattr(owner, "OutOfMemoryError", None)
            if isinstance(oom_type, type) and isinstance(e, oom_type):
                return True
    return isinstance(e, RuntimeError) and any(m in str(e) for m in _OOM_MESSAGES)


class exit_on_oom(contextlib.ContextDecorator):
    """Context manager and decorator: an out-of-memory error inside
    (torch.OutOfMemoryError or torch.cuda.OutOfMemoryError, a RuntimeError
    saying "out of memory" or
    "DefaultCPUAllocator: can't allocate memory", MemoryError) prints its
    traceback, writes the exit file (code 75, reason "oom"), reports the
    exit and ends the process with os._exit(75): CUDA's state after a hard
    out-of-memory is not worth unwinding through, and trainsupd restarts the
    attempt from the newest checkpoint. Other exceptions pass through."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None and _is_oom(exc):
            traceback.print_exception(exc_type, exc, tb, file=sys.stderr)
            exit(75, "oom", "%s: %s" % (exc_type.__name__, exc))
        return False


def _exit_with(code, reason, message, first_bad_step):
    c = _client()
    if c is not None:
        c.report_exit(code, reason, message, first_bad_step)
        if c.link is not None:
            c.link.stop()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def exit(code, reason=None, message=""):
    """Writes the exit file (under trainsupd) and sends the ExitReport, then
    ends the process with os._exit(code) after flushing stdout and stderr:
    atexit handlers do not run, so close your own files first. `reason`
    defaults to the contract's word for `code` ("completed", "oom",
    "stopped", ...; "error" for any other code)."""
    code = int(code)
    if not 0 <= code <= 255:
        raise ValueError("trainsup.exit: code must be in [0, 255], got %d" % code)
    if reason is None:
        reason = EXIT_CODES.get(code, "error")
    _exit_with(code, reason, message, -1)


def skip_windows():
    """The windows of steps whose batches this attempt must skip, as
    [(first, last), ...] (inclusive; the steps you pass to progress()):
    TRAINSUP_SKIP_WINDOWS, which trainsupd sets after a rollback
    (docs/guard.md). [] when none. ValueError when it does not parse."""
    text = os.environ.get("TRAINSUP_SKIP_WINDOWS", "")
    windows = []
    for entry in filter(None, text.split(",")):
        first, sep, last = entry.partition("-")
        try:
            first, last = int(first), int(last)
        except ValueError:
            first = last = 0
        if not sep or first < 1 or last < first:
            raise ValueError("trainsup: TRAINSUP_SKIP_WINDOWS: %r is not FIRST-LAST" % entry)
        windows.append((first, last))
    return windows


def skip_step(step):
    """True when step `step`'s batch is in a skip window: draw it (so the
    data order goes on) and do not train on it. Counted as a skipped step
    of the run's tally."""
    skip = any(first <= step <= last for first, last in skip_windows())
    c = _client()
    if skip and c is not None and c.link is not None:
        with c.lock:
            if step not in c.window_steps:
                c.window_steps.add(step)
                c.progress.tally.skipped_window += 1
                c.update_tally()
                c.publish()
    return skip


def report_final(metric, baseline=None):
    """The final model's score on the validation split (`metric`, e.g. its
    mIoU) and, when known, the majority-class baseline's on the same split.
    trainsupd judges a run that completed by them (docs/guard.md): below the
    baseline it ends FAILED unless the spec's guard.fail_below_baseline is
    false. Call it before the script returns. No-op outside trainsupd."""
    c = _client()
    if c is None or c.link is None:
        return
    with c.lock:
        c.progress.tally.final_metric = float(metric)
        c.progress.tally.baseline_metric = -1.0 if baseline is None else float(baseline)
        c.publish()


_TALLY_FILE = "trainsup_tally.json"


def _read_tally(path):
    """The skip counts a checkpoint recorded ({} when none)."""
    if not path:
        return {}
    try:
        with open(os.path.join(path, _TALLY_FILE)) as f:
            data = json.load(f)
        return {k: int(v) for k, v in data.items() if isinstance(v, int) and v >= 0}
    except (OSError, ValueError, AttributeError):
        return {}


def lr_factor():
    """The learning rate's factor after rollbacks (TRAINSUP_LR_FACTOR,
    guard.lr_factor_on_rollback to the number of rollbacks); 1.0 when none."""
    text = os.environ.get("TRAINSUP_LR_FACTOR", "")
    if not text:
        return 1.0
    value = float(text)
    if not 0 < value <= 1:
        raise ValueError("trainsup: TRAINSUP_LR_FACTOR must be in (0, 1], got %r" % text)
    return value


# The oldest bad step a Guard still counts (None: none): checkpoint()'s
# retention keeps the newest checkpoint below it, a rollback's target.
_keep_before = None


def _finite(x):
    return x == x and x not in (float("inf"), float("-inf"))


class Guard:
    """The worker's training guard for a script (docs/guard.md):

        guard = trainsup.Guard()
        ...
        loss.backward()
        if guard.check(step, loss, model):   # False: do not apply this step
            optimizer.step()
        optimizer.zero_grad()

    check() is False when the loss or the gradient norm of `model`'s
    parameters is NaN or infinite, or the loss is above spike_factor times
    the median of the last spike_window applied losses (after spike_warmup
    applied steps; spike_factor 0: off). Each such step is reported (a
    GUARD event, the heartbeat's counters). max_bad_steps of them within
    the last bad_window steps end the process with exit 79 ("diverged"),
    naming the first: trainsupd then resumes from the newest checkpoint
    before it and skips a window of batches (skip_step()).

    With fp16 and a torch.amp.GradScaler, pass it (docs/python-client.md,
    "Mixed precision"):

        scaler.scale(loss).backward()
        if guard.check(step, loss, model, scaler=scaler):
            scaler.step(optimizer)   # skips the step itself on an overflow
            scaler.update()          # and lowers the scale

    A finite loss whose gradient is not finite is then the scaler's routine
    overflow, as GradScaler sees it: check() is True (scaler.step skips it),
    and the step is counted as skipped by the loss scaler, never as a bad
    step. Overflows become divergence (exit 79, the usual rollback) when
    max_overflow_streak of them come in a row, or when the scale would fall
    below min_scale: at a scale under 1 the gradient overflows fp16 without
    any scaling, which no healthy run does. A non-finite loss is a bad step
    with or without a scaler: lowering the scale does not mend a forward
    pass. bf16 needs no scaler, and its non-finite steps are bad steps."""

    def __init__(self, max_bad_steps=3, bad_window=100, spike_factor=6.0, spike_window=50,
                 spike_warmup=20, max_overflow_streak=20, min_scale=1.0):
        if not 1 <= max_bad_steps <= bad_window:
            raise ValueError("trainsup.Guard: need 1 <= max_bad_steps <= bad_window")
        if spike_factor != 0 and spike_factor < 1.5:
            raise ValueError("trainsup.Guard: spike_factor must be 0 (off) or >= 1.5")
        if int(max_overflow_streak) < 1:
            raise ValueError("trainsup.Guard: max_overflow_streak must be >= 1")
        if not float(min_scale) > 0:
            raise ValueError("trainsup.Guard: min_scale must be > 0")
        self.max_bad_steps, self.bad_window = int(max_bad_steps), int(bad_window)
        self.spike_factor, self.spike_window = float(spike_factor), int(spike_window)
        self.spike_warmup = int(spike_warmup)
        self.max_overflow_streak, self.min_scale = int(max_overflow_streak), float(min_scale)
        self._losses = []
        self._applied = 0
        self._bad = []  # (step, what was seen)
        self._overflows = []  # the current streak of scaler overflows: (step, scale)
        self.overflow_steps = 0  # steps the scaler skipped, in this process

    def median(self):
        v = sorted(self._losses)
        if not v:
            return 0.0
        mid = len(v) // 2
        return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2

    @staticmethod
    def _grad_norm(model):
        parameters = model.parameters() if hasattr(model, "parameters") else model
        import torch
        norms = [p.grad.detach().double().norm() for p in parameters if p.grad is not None]
        return float(torch.stack(norms).norm()) if norms else 0.0

    def check(self, step, loss, model=None, scaler=None):
        """Judges step `step`: True to apply it (with a scaler: to hand it
        to scaler.step). `loss` a number or a one-element tensor, unscaled;
        `model` a module or parameters whose .grad backward() filled (None:
        the loss only); `scaler` a torch.amp.GradScaler or None. In a DDP
        script, pass the loss every rank sees (all-reduced), and the
        gradient after DDP's allreduce: each rank must decide alike."""
        global _keep_before
        loss = float(loss.detach()) if hasattr(loss, "detach") else float(loss)
        seen, spike = None, False
        scaling = scaler is not None and scaler.is_enabled()
        if not _finite(loss):
            seen = "loss %s" % ("nan" if loss != loss else loss)
        elif model is not None and not _finite(self._grad_norm(model)):
            if scaling:
                return self._overflow(step, loss, scaler)
            seen = "gradient norm not finite (loss %g)" % loss
        elif self.spike_factor > 0 and self._applied >= self.spike_warmup:
            median = self.median()
            if median > 0 and loss > self.spike_factor * median:
                seen, spike = "loss %g is %.1f times the median %g" % (loss, loss / median,
                                                                        median), True
        if seen is None:
            self._overflows = []
            self._losses = (self._losses + [loss])[-self.spike_window:]
            self._applied += 1
            self._bad = [b for b in self._bad if b[0] > step - self.bad_window]
            _keep_before = self._bad[0][0] if self._bad else None
            return True
        self._bad = [b for b in self._bad if b[0] > step - self.bad_window] + [(step, seen)]
        _keep_before = self._bad[0][0]
        line = "step %d not applied (%s): %s" % (step, "loss spike" if spike else "not finite",
                                                seen)
        print("trainsup: " + line, file=sys.stderr)
        c = _client()
        if c is not None:
            c.send_guard_step(step, spike, line)
        if len(self._bad) >= self.max_bad_steps:
            first = self._bad[0][0]
            message = "diverged at step %d: %d bad steps within %d (%s)" % (
                first, len(self._bad), self.bad_window,
                "; ".join("step %d: %s" % b for b in self._bad))
            _exit_with(79, "diverged", message, first)
        return False

    def _overflow(self, step, loss, scaler):
        """A gradient overflow under loss scaling: the scaler's skip, or
        divergence when the streak or the scale says so."""
        global _keep_before
        scale = float(scaler.get_scale())
        backoff = float(scaler.get_backoff_factor())
        self._overflows.append((step, scale))
        self.overflow_steps += 1
        first = self._overflows[0][0]
        if len(self._overflows) >= self.max_overflow_streak or scale * backoff < self.min_scale:
            why = ("%d overflows in a row" % len(self._overflows)
                   if len(self._overflows) >= self.max_overflow_streak else
                   "the scale would fall to %g, below min_scale %g" % (scale * backoff,
                                                                       self.min_scale))
            message = ("diverged at step %d: the loss scaler overflowed at every step since "
                       "(%s; loss %g, scale %g at step %d)" % (first, why, loss, scale, step))
            print("trainsup: " + message, file=sys.stderr)
            _keep_before = first
            _exit_with(79, "diverged", message, first)
        line = ("step %d skipped by the loss scaler: gradient overflow at scale %g, the scale "
                "goes to %g (loss %g; not a bad step)" % (step, scale, scale * backoff, loss))
        print("trainsup: " + line, file=sys.stderr)
        c = _client()
        if c is not None:
            c.send_scaler_skip(step, line)
        return True


def handle_sigterm():
    """Installs a SIGTERM handler (main thread only) that only sets the flag
    stop_requested() reads; the training loop then checkpoints and calls
    trainsup.exit(143)."""
    def on_sigterm(signum, frame):
        c = _client()
        if c is not None:
            c.sigterm = True
        else:
            global _child_sigterm
            _child_sigterm = True
    signal.signal(signal.SIGTERM, on_sigterm)


_child_sigterm = False


def stop_requested():
    """True after the daemon's Stop command or a SIGTERM caught by
    handle_sigterm()."""
    c = _client()
    if c is None:
        return _child_sigterm
    return c.sigterm or (c.link is not None and c.link.stop_requested)


def stop_deadline_s():
    """Seconds the daemon's Stop allows before it kills the process group;
    0 when no Stop arrived."""
    c = _client()
    return c.link.stop_deadline_s if c is not None and c.link is not None else 0


def checkpoint_requested():
    """True once for each CheckpointNow the daemon sent (then it is taken)."""
    c = _client()
    return c is not None and c.link is not None and c.link.take_checkpoint_request()


if os.environ.get("TRAINSUP_SUPERVISOR"):
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    _client()
