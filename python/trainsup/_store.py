"""The on-disk formats trainsupd reads, written the way the C++ side writes
them: checkpoints with MANIFEST.json (checkpoint/store.h, manifest.h) and the
exit file (contracts/exit_file.h). Pure Python plus the xxhash module (Debian's
python3-xxhash) for the manifest's XXH3-128.

Commit protocol (docs/checkpoints.md): files are written into
ROOT/step-N.tmp, each fsynced, MANIFEST.json written and fsynced, the
directory fsynced, renamed to ROOT/step-N (an existing step-N first steps
aside as step-N.replaced.tmp), ROOT fsynced, then retention. A checkpoint is
therefore complete or invisible.

Several writers may share ROOT (a script and its async-checkpoint child,
docs/python-client.md). Each writer of step N holds an exclusive flock on
ROOT/step-N.writer.tmp from begin() until commit or abort; clean_leftovers
removes a step-N.tmp only when it can take that lock (its writer is gone: the
kernel drops a dead process's locks), so no writer deletes another's
checkpoint in progress.
"""

import datetime
import errno
import fcntl
import json
import os
import shutil
import time

FORMAT = "trainsup-checkpoint"
FORMAT_VERSION = 1
MANIFEST_NAME = "MANIFEST.json"
_TMP_SUFFIX = ".tmp"
_REPLACED_SUFFIX = ".replaced.tmp"
_WRITER_SUFFIX = ".writer.tmp"
_READ_CHUNK = 1 << 20


def step_dir_name(step):
    return "step-%d" % step


def parse_step_dir_name(name):
    """N for "step-N" (decimal, no sign), else -1 (as ParseStepDirName)."""
    if not name.startswith("step-"):
        return -1
    digits = name[len("step-"):]
    if not digits or not all("0" <= c <= "9" for c in digits):
        return -1
    return int(digits)


def _xxh3_128():
    try:
        import xxhash
    except ImportError as e:
        raise ImportError(
            "trainsup checkpoints need the xxhash module for their manifest's "
            "XXH3-128 hashes (Debian: apt-get install python3-xxhash)") from e
    return xxhash.xxh3_128()


def hash_file(path):
    """(size, 32 lower-case hex digits of XXH3-128, canonical form)."""
    h = _xxh3_128()
    size = 0
    with open(path, "rb") as f:
        while True:
            piece = f.read(_READ_CHUNK)
            if not piece:
                break
            h.update(piece)
            size += len(piece)
    return size, h.hexdigest()


def _fsync_path(path, directory=False):
    flags = os.O_RDONLY | (os.O_DIRECTORY if directory else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _write_durably(path, data):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class CheckpointStore:
    """ROOT/step-N directories, as CheckpointStore in checkpoint/store.h.

    keep_last: the newest committed checkpoints kept (None: all);
    keep_every: also keep every step that is a multiple (0: none). The
    checkpoint just committed is never removed, nor, with keep_before set,
    the newest below that step (a rollback's target, docs/guard.md).
    """

    def __init__(self, root, keep_last=3, keep_every=0, keep_before=None):
        if keep_last is not None and keep_last < 1:
            raise ValueError("keep_last must be >= 1 or None, got %r" % (keep_last,))
        if keep_every < 0:
            raise ValueError("keep_every must be >= 0, got %r" % (keep_every,))
        self.root = root
        self._writers = {}  # tmp path -> (lock path, fd) of the saves this object runs
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.keep_before = keep_before

    def begin(self, step):
        """Takes step N's writer lock, removes leftovers of interrupted
        saves (none of a live writer's) and creates step-N.tmp; returns its
        path. RuntimeError when another live writer is saving step N."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError("checkpoint step must be an integer >= 0, got %r" % (step,))
        os.makedirs(self.root, exist_ok=True)
        lock_path = os.path.join(self.root, step_dir_name(step) + _WRITER_SUFFIX)
        fd = _lock_writer(lock_path)
        if fd is None:
            raise RuntimeError("checkpoint step %d: another process is saving it in %s" %
                               (step, self.root))
        try:
            self.clean_leftovers()
            tmp = os.path.join(self.root, step_dir_name(step) + _TMP_SUFFIX)
            # A dead writer's step-N.tmp: its lock is ours now.
            if os.path.lexists(tmp):
                _remove(tmp)
            os.mkdir(tmp)
        except BaseException:
            _unlock_writer(lock_path, fd)
            raise
        self._writers[tmp] = (lock_path, fd)
        return tmp

    def abort(self, tmp):
        shutil.rmtree(tmp, ignore_errors=True)
        self._release(tmp)

    def _release(self, tmp):
        lock = self._writers.pop(tmp, None)
        if lock is not None:
            _unlock_writer(*lock)

    def commit(self, step, tmp):
        """Makes step-N.tmp durable and visible as step-N, then applies
        retention. Only regular files may be in it (the manifest lists file
        names without '/'); anything else is an error and the .tmp directory
        is removed. Returns the committed directory."""
        try:
            files = []
            for name in sorted(os.listdir(tmp)):
                path = os.path.join(tmp, name)
                if name == MANIFEST_NAME:
                    raise ValueError("checkpoint file name %r is reserved for the manifest" % name)
                if os.path.islink(path) or not os.path.isfile(path):
                    raise ValueError(
                        "checkpoint step %d: %r is not a regular file; a checkpoint holds "
                        "regular files only, no directories or links" % (step, name))
                _fsync_path(path)
                size, digest = hash_file(path)
                files.append({"name": name, "size": size, "xxh3_128": digest})
            manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "step": step,
                        "created": _now_rfc3339(), "files": files}
            _write_durably(os.path.join(tmp, MANIFEST_NAME),
                           (json.dumps(manifest, indent=2) + "\n").encode())
            _fsync_path(tmp, directory=True)
            final = os.path.join(self.root, step_dir_name(step))
            replaced = final + _REPLACED_SUFFIX
            replacing = os.path.exists(final)
            if replacing:
                # The old copy steps aside under a name clean_leftovers (and
                # the C++ ChooseLatest) restore while no step-N exists.
                shutil.rmtree(replaced, ignore_errors=True)
                os.rename(final, replaced)
            try:
                os.rename(tmp, final)
            except OSError:
                if replacing:
                    os.rename(replaced, final)
                raise
        except BaseException:
            self.abort(tmp)
            raise
        _fsync_path(self.root, directory=True)
        self._release(tmp)
        if replacing:
            shutil.rmtree(replaced, ignore_errors=True)
        self.apply_retention(step)
        return final

    def list(self):
        """[(step, path)] of committed checkpoints, oldest first (unverified)."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            step = parse_step_dir_name(name)
            path = os.path.join(self.root, name)
            if step >= 0 and os.path.isdir(path):
                out.append((step, path))
        out.sort()
        return out

    def apply_retention(self, keep_step=-1):
        if self.keep_last is None:
            return
        committed = self.list()
        target = None
        if self.keep_before is not None:
            below = [step for step, _ in committed if step < self.keep_before]
            target = max(below) if below else None
        for step, path in committed[:max(0, len(committed) - self.keep_last)]:
            if self.keep_every > 0 and step % self.keep_every == 0:
                continue
            if step == target:
                continue
            if step == keep_step:
                continue
            trash = path + ".deleting" + _TMP_SUFFIX
            os.rename(path, trash)
            shutil.rmtree(trash, ignore_errors=True)

    def clean_leftovers(self):
        """Restores step-N.replaced.tmp where step-N is missing, then removes
        the other step-*.tmp leftovers whose writer is gone (its writer lock
        can be taken), and the locks of writers that are gone."""
        if not os.path.isdir(self.root):
            return
        for name in os.listdir(self.root):
            if name.startswith("step-") and name.endswith(_REPLACED_SUFFIX):
                original = os.path.join(self.root, name[:-len(_REPLACED_SUFFIX)])
                if not os.path.exists(original):
                    os.rename(os.path.join(self.root, name), original)
        names = os.listdir(self.root)
        for name in names:
            if (not name.startswith("step-") or not name.endswith(_TMP_SUFFIX) or
                    name.endswith(_WRITER_SUFFIX)):
                continue
            path = os.path.join(self.root, name)
            if path in self._writers:
                continue  # this object's own save in progress
            lock_path = os.path.join(self.root, name[:-len(_TMP_SUFFIX)] + _WRITER_SUFFIX)
            fd = _lock_writer(lock_path, create=False)
            if fd is None:
                continue  # a live writer's
            try:
                _remove(path)
            finally:
                if fd >= 0:
                    _unlock_writer(lock_path, fd)
        for name in names:
            if name.startswith("step-") and name.endswith(_WRITER_SUFFIX):
                lock_path = os.path.join(self.root, name)
                if lock_path in [w[0] for w in self._writers.values()]:
                    continue
                fd = _lock_writer(lock_path, create=False)
                if fd is not None and fd >= 0:
                    _unlock_writer(lock_path, fd)


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def _lock_writer(lock_path, create=True):
    """The writer lock at lock_path, held: its fd; None when a live process
    holds it; -1 when it does not exist and create is False. The file is
    the one at lock_path when the lock is taken (a cleaner may unlink it
    between our open and our flock: then we try again)."""
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0),
                         0o600)
        except FileNotFoundError:
            return -1
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            raise
        try:
            same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
        if not create:
            return -1


def _unlock_writer(lock_path, fd):
    """Unlinks the lock file while holding it, then releases it."""
    try:
        os.unlink(lock_path)
    except FileNotFoundError:
        pass
    os.close(fd)


def exit_file_path(run_dir, attempt, rank):
    """RUN_DIR/attempts/A/rank-R.exit.json (contracts/run_layout.h)."""
    return os.path.join(run_dir, "attempts", str(attempt), "rank-%d.exit.json" % rank)


def write_exit_file(run_dir, attempt, rank, code, reason, message, last_step, first_bad_step=-1):
    """Writes the exit file atomically (temporary file in the same
    directory, fsynced, renamed, directory fsynced), as WriteExitFile.
    `first_bad_step`: a diverged exit's (79) first bad step, -1 otherwise."""
    if not 0 <= code <= 255:
        raise ValueError("exit code must be in [0, 255], got %r" % (code,))
    path = exit_file_path(run_dir, attempt, rank)
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    body = {"code": int(code), "reason": str(reason), "message": str(message),
            "last_step": int(last_step), "time_ms": int(time.time() * 1000),
            "first_bad_step": int(first_bad_step)}
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        _write_durably(tmp, (json.dumps(body, indent=2) + "\n").encode("utf-8", "replace"))
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_path(directory, directory=True)
    return path
