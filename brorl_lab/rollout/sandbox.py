"""Run untrusted, model-written Python in a separate, resource-limited and (where the kernel allows) isolated process.

    from brorl_lab.rollout.sandbox import UnitTest, run_untrusted
    res = run_untrusted("def f(x):\n    return 2 * x\n", [UnitTest("f(2)", 4), UnitTest("f(-1)", -2)])
    res.status, res.passed, res.total, res.fraction, res.isolation      # 'ok', 2, 2, 1.0, {...}

How one run works
-----------------
The parent starts ``python -I -S -B <this file> <fd>`` in a new session with an empty environment, sends the code
and the test *calls* (never the expected values) on stdin, and reads three pipes with bounds: stdout, stderr, and a
dedicated result pipe (an inherited fd, so printing cannot forge a result). This file, run as a script, is the
harness. Before any untrusted line runs it

* unshares a network namespace (no interfaces but a down loopback: nothing can be reached), a mount namespace
  (the whole tree read-only and nosuid; fresh small tmpfs over /tmp, /var/tmp, /dev/shm, /run; /root and /home
  hidden, only the Python installation re-exposed read-only; the working directory is an empty tmpfs directory
  that vanishes with the namespace) and a PID namespace (the harness becomes its init: when it dies the kernel
  kills every process left inside, which is what stops a fork bomb even as root, where RLIMIT_NPROC is ignored);
  a non-root caller first enters a user namespace to be allowed to do this;
* sets RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_NOFILE and no core files;
* sets no_new_privs, and as root switches to a fresh random uid/gid (no files, no other processes: RLIMIT_NPROC
  then applies, it cannot signal the host's processes, and leftovers can be swept by uid); a non-root caller in a
  user namespace drops all capabilities instead;
* where a namespace is missing (old kernel, containers that forbid unshare, ``namespaces=False``), installs a
  PEP 578 audit hook that refuses sockets, subprocesses, ctypes, writes outside the working directory and
  signals to foreign processes; the parent then also sweeps the fresh uid's processes and files afterwards.

It writes a setup record (the isolation actually obtained) to the result pipe, runs the code, evaluates each test
call, writes the JSON-encoded return values and exits. The parent compares them with the expected values, which
never enter the sandbox: writing to the result fd or patching the harness cannot produce a pass without computing
the right answers. A wall-clock deadline kills the whole session (and the sandbox uid's processes).

This is damage control for buggy or mischievous model output, not a security boundary against a determined
attacker: the kernel is shared, and the audit-hook fallback can be bypassed by a program that corrupts the
interpreter's memory.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

# Status of a run: only "ok" runs earn credit.
STATUSES = ("ok", "exec_error", "timeout", "output_limit", "crashed")

_RESULT_LIMIT = 8 << 20  # bytes the result pipe may carry (test return values); more is treated as a crash
_REAP_ROUNDS = 20


@dataclass(frozen=True)
class UnitTest:
    """One test: ``call`` is a Python expression evaluated after the solution ran (e.g. ``"f([1, 2])"``);
    ``expected`` is a JSON-compatible value compared in the parent (it is never sent into the sandbox)."""

    call: str
    expected: Any


@dataclass
class SandboxResult:
    status: str  # one of STATUSES
    passed: int  # tests whose return value equals the expected value
    total: int
    outcomes: list[str] = field(default_factory=list)  # per test: "pass", "fail: got ...", "error: ..."
    stdout: str = ""
    stderr: str = ""
    output_truncated: bool = False
    elapsed_s: float = 0.0
    returncode: Optional[int] = None
    cpu_s: float = 0.0  # CPU time of the harness and the processes it reaped
    isolation: dict = field(default_factory=dict)  # what the harness obtained: user, network, pid, fs, guard
    detail: str = ""  # why (the exception of an exec_error, the limit that was hit, ...)
    pid: Optional[int] = None  # the harness's pid (also its session and process-group id)
    sandbox_uid: Optional[int] = None  # the fresh uid the code ran as (root callers only)

    @property
    def fraction(self) -> float:
        """Fraction of tests passed; 0 unless the run completed (error, timeout, crash or output flood score 0)."""
        return self.passed / self.total if self.status == "ok" and self.total else 0.0


# --------------------------------------------------------------------------------------------------- the parent


def _positive(name: str, value: Any, *, integer: bool = False, minimum: float = 0.0) -> None:
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or not math.isfinite(value) or value <= minimum:
        kind = "an integer" if integer else "a finite number"
        raise ValueError(f"{name} must be {kind} > {minimum:g}, got {value!r}")


def _normalise_expected(tests: Sequence[UnitTest]) -> list[Any]:
    if isinstance(tests, (str, bytes)) or not isinstance(tests, Sequence):
        raise ValueError(f"tests must be a sequence of UnitTest, got {type(tests).__name__}")
    out = []
    for i, t in enumerate(tests):
        if not isinstance(t, UnitTest) or not isinstance(t.call, str):
            raise ValueError(f"tests[{i}] must be a UnitTest with a str call, got {t!r}")
        try:  # the child's values arrive through JSON, so compare against the JSON form (tuples become lists)
            out.append(json.loads(json.dumps(t.expected)))
        except (TypeError, ValueError) as e:
            raise ValueError(f"tests[{i}].expected must be JSON-compatible, got {t.expected!r} ({e})") from None
    return out


def values_equal(got: Any, expected: Any) -> bool:
    """Equality of JSON values as a test checks it: floats within 1e-9, bools never equal to numbers."""
    if isinstance(got, bool) or isinstance(expected, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(got, (int, float)) and isinstance(expected, (int, float)):
        return math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9) or got == expected
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(values_equal(a, b) for a, b in zip(got, expected))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(values_equal(got[k], expected[k]) for k in got)
    return type(got) is type(expected) and got == expected


def _id_ranges(path: str) -> list[tuple[int, int]]:
    """[start, end) ranges of ids usable in this user namespace (all of them when the map cannot be read)."""
    try:
        with open(path) as f:
            return [(int(a), int(a) + int(n)) for a, _, n in (line.split() for line in f if line.strip())]
    except (OSError, ValueError):
        return [(0, 1 << 32)]


def _fresh_id() -> Optional[int]:
    """A random uid (used as gid too) that owns no files and runs no processes: one valid in this namespace's uid
    and gid maps, preferably in [2**24, 2**30) (clear of system ids and the usual subordinate-id ranges). None when
    the maps leave no room (e.g. a container mapping a single id)."""
    import secrets

    spans = []
    for u0, u1 in _id_ranges("/proc/self/uid_map"):
        for g0, g1 in _id_ranges("/proc/self/gid_map"):
            lo, hi = max(u0, g0, 1), min(u1, g1, 1 << 30)  # never 0 (root); below 2**30 stays clear of 65534-style ids
            spans.append((max(lo, 1 << 24) if hi > (1 << 24) + 1024 else max(lo, (lo + hi) // 2), hi))
    spans = [(lo, hi) for lo, hi in spans if hi - lo >= 64]
    if not spans:
        return None
    lo, hi = max(spans, key=lambda r: r[1] - r[0])
    for _ in range(20):
        candidate = lo + secrets.randbelow(hi - lo)
        if candidate not in (65534, 65535) and (hi - lo > 1 << 20 or not _uid_processes(candidate)):
            return candidate
    return None


def _uid_processes(uid: int) -> list[int]:
    """Live (not zombie) pids whose real, effective or saved uid is ``uid``, from /proc/<pid>/status."""
    pids, want = [], str(uid).encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f if line.startswith((b"State:", b"Uid:")))
        except (OSError, ValueError):
            continue
        if want in fields.get(b"Uid", b"").split()[:3] and not fields.get(b"State", b"").strip().startswith(b"Z"):
            pids.append(int(name))
    return pids


def _reap_uid(uid: int) -> None:
    """Kill every process of ``uid``: a helper running as that uid calls kill(-1, SIGKILL), which reaches processes
    that left the session and has no pid-reuse race, until /proc shows none (bounded: a fork bomb is capped by
    RLIMIT_NPROC, so each round kills all but the few forked meanwhile)."""
    import subprocess

    for _ in range(_REAP_ROUNDS):
        if not _uid_processes(uid):
            return
        subprocess.run(
            [sys.executable, "-I", "-S", "-B", os.path.abspath(__file__), "--reap", str(uid)],
            env={}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10,
        )


def _remove_owned(uid: int, dirs: Sequence[str]) -> list[str]:
    """Delete the top-level entries of ``dirs`` owned by ``uid`` (what a sandbox without a mount namespace left in
    world-writable places). Returns the paths removed."""
    import shutil

    removed = []
    for d in dirs:
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                if e.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path, ignore_errors=True)
                else:
                    os.unlink(e.path)
                removed.append(e.path)
            except OSError:
                pass
    return removed


def run_untrusted(
    code: str,
    tests: Sequence[UnitTest],
    *,
    wall_timeout: float = 5.0,
    cpu_seconds: Optional[float] = None,
    memory_mb: int = 512,
    max_output_bytes: int = 64 << 10,
    max_file_bytes: int = 1 << 20,
    max_processes: int = 8,
    namespaces: bool = True,
) -> SandboxResult:
    """Run ``code`` then each test call in a sandboxed process; return what happened (never raises on bad code).

    ``cpu_seconds`` (default: ``wall_timeout``, rounded up to whole seconds) bounds each process's CPU time;
    ``memory_mb`` its address space; ``max_output_bytes`` stdout and stderr each (more kills the run:
    "output_limit"); ``max_file_bytes`` any file it writes; ``max_processes`` its processes and threads.
    ``namespaces=False`` skips the namespaces (to exercise the fallback the harness uses where they are refused).
    """
    import shutil
    import subprocess
    import tempfile

    if not isinstance(code, str):
        raise ValueError(f"code must be a str, got {type(code).__name__}")
    expected = _normalise_expected(tests)
    _positive("wall_timeout", wall_timeout)
    if cpu_seconds is None:
        cpu_seconds = wall_timeout
    _positive("cpu_seconds", cpu_seconds)
    _positive("memory_mb", memory_mb, integer=True, minimum=31)  # the interpreter alone needs ~30 MB of address space
    _positive("max_output_bytes", max_output_bytes, integer=True)
    _positive("max_file_bytes", max_file_bytes, integer=True)
    _positive("max_processes", max_processes, integer=True)
    cpu_limit = int(math.ceil(cpu_seconds))

    uid = _fresh_id() if os.geteuid() == 0 else None
    host_dir = tempfile.mkdtemp(prefix="brorl-sandbox-")  # the working directory when there is no mount namespace
    try:
        if uid is not None:
            os.chown(host_dir, uid, uid)
        payload = json.dumps({
            "code": code, "calls": [t.call for t in tests], "workdir": host_dir, "uid": uid,
            "namespaces": bool(namespaces), "cpu_seconds": cpu_limit, "memory_bytes": int(memory_mb) << 20,
            "max_file_bytes": int(max_file_bytes), "max_processes": int(max_processes),
        }).encode()
        result_r, result_w = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", os.path.abspath(__file__), str(result_w)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={}, cwd=host_dir,
                start_new_session=True, pass_fds=(result_w,), close_fds=True,
            )
        except BaseException:
            os.close(result_r)
            raise
        finally:
            os.close(result_w)
        run = _Supervisor(proc, os.fdopen(result_r, "rb", buffering=0), uid,
                          {"out": max_output_bytes, "err": max_output_bytes, "res": _RESULT_LIMIT})
        run.supervise(payload, wall_timeout)
        isolation = _setup_record(run.bufs["res"])
        if uid is not None and not isolation.get("fs", "").startswith("mntns"):
            _remove_owned(uid, ("/tmp", "/var/tmp", "/dev/shm"))
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
    rusage, returncode = run.exit_info.get("rusage"), run.exit_info.get("returncode")
    res = SandboxResult(
        status="crashed", passed=0, total=len(expected),
        stdout=bytes(run.bufs["out"]).decode("utf-8", "replace"),
        stderr=bytes(run.bufs["err"]).decode("utf-8", "replace"), output_truncated=run.truncated,
        elapsed_s=run.elapsed, returncode=returncode,
        cpu_s=(rusage.ru_utime + rusage.ru_stime) if rusage is not None else 0.0,
        isolation=isolation, pid=proc.pid, sandbox_uid=uid,
    )
    if run.status is not None:
        res.status, res.detail = run.status, run.why
    else:
        _judge(res, _records(run.bufs["res"]), expected, cpu_limit)
    return res


class _Supervisor:
    """The parent's side of one run: feed the payload, read the three pipes within bounds, enforce the deadline,
    and end the run so that nothing is left (see :meth:`end`)."""

    def __init__(self, proc, res_file, uid: Optional[int], limits: dict):
        self.proc, self.res_file, self.uid, self.limits = proc, res_file, uid, limits
        self.bufs = {name: bytearray() for name in limits}
        self.status: Optional[str] = None  # set when the parent ended the run: timeout, output_limit, crashed
        self.why, self.truncated, self.ended, self.elapsed = "", False, False, 0.0
        self.exit_info: dict = {}  # "returncode", "rusage" once the harness is reaped

    def reaped(self, wait_s: float) -> bool:
        # wait4 rather than Popen.wait: its rusage (children included) tells a CPU-limit kill from a crash
        import time

        stop = time.monotonic() + wait_s
        while "returncode" not in self.exit_info:
            pid, wstatus, ru = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.exit_info.update(returncode=os.waitstatus_to_exitcode(wstatus), rusage=ru)
                self.proc.returncode = self.exit_info["returncode"]  # so Popen does not wait for it again
            elif time.monotonic() >= stop:
                return False
            else:
                time.sleep(0.002)
        return True

    def end(self) -> None:
        self.ended = True
        pidns = _setup_record(self.bufs["res"]).get("pid") == "pidns"
        if pidns and "returncode" not in self.exit_info:
            # The outer harness kills its namespace's init and reaps it: the kernel kills everything left in the
            # namespace, and nothing is orphaned.
            os.kill(self.proc.pid, 15)
            self.reaped(1.0)
        try:  # the session: the harness and whatever did not leave it
            os.killpg(self.proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        self.reaped(1.0)
        if self.uid is not None and not pidns:  # processes that left the session are still the sandbox uid's
            _reap_uid(self.uid)

    def stop(self, status: str, why: str) -> None:
        if self.status is None:
            self.status, self.why = status, why
            self.end()

    def supervise(self, payload: bytes, wall_timeout: float) -> None:  # noqa: C901 - the supervisor's limits and kill paths read as one sequence (security code)
        import selectors
        import time

        proc = self.proc
        start = time.monotonic()
        deadline = start + wall_timeout
        sel = selectors.DefaultSelector()
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE, "in")
        for f, name in ((proc.stdout, "out"), (proc.stderr, "err"), (self.res_file, "res")):
            sel.register(f, selectors.EVENT_READ, name)
        sent = 0
        try:
            while sel.get_map():
                now = time.monotonic()
                if now >= deadline:
                    if self.ended:
                        break  # stragglers we could not kill still hold a pipe: stop reading
                    self.stop("timeout", f"wall-clock limit of {wall_timeout:g} s")
                    deadline = time.monotonic() + 1.0  # grace to drain what the pipes still hold
                for key, _ in sel.select(timeout=max(0.0, min(deadline - now, 0.05))):
                    if key.data == "in":
                        try:
                            sent += os.write(key.fileobj.fileno(), payload[sent:sent + 65536])
                        except BlockingIOError:
                            pass
                        except BrokenPipeError:
                            sent = len(payload)
                        if sent >= len(payload):
                            sel.unregister(key.fileobj)
                            key.fileobj.close()
                        continue
                    chunk = os.read(key.fileobj.fileno(), 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    buf, room = self.bufs[key.data], self.limits[key.data] - len(self.bufs[key.data])
                    buf += chunk[:max(room, 0)]
                    if len(chunk) > room:
                        self.truncated = True
                        if key.data == "res":
                            self.stop("crashed", f"result pipe over {self.limits['res']} bytes")
                        else:
                            stream = "stdout" if key.data == "out" else "stderr"
                            self.stop("output_limit", f"{stream} exceeded {self.limits[key.data]} bytes")
                        deadline = min(deadline, time.monotonic() + 1.0)
                if not self.ended and self.reaped(0.0):  # the harness is done: end stragglers holding the pipes
                    self.end()
                    deadline = min(deadline, time.monotonic() + 1.0)
        finally:
            sel.close()
            for f in (proc.stdin, proc.stdout, proc.stderr, self.res_file):
                f.close()
            # All pipes closed means the harness is exiting: let it (its status tells a CPU kill from a clean exit).
            if not self.reaped(max(0.0, min(deadline - time.monotonic(), 1.0))):
                self.end()
                self.reaped(10.0)
            self.elapsed = time.monotonic() - start


def _judge(res: SandboxResult, records: list, expected: list, cpu_limit: int) -> None:
    """Fill ``res`` from the harness's records: [setup, outputs] is the only well-formed sequence."""
    outputs = records[1] if len(records) == 2 and isinstance(records[1], dict) else None
    if outputs is None or outputs.get("kind") != "outputs":
        res.detail = _crash_detail(res.returncode, res.cpu_s, cpu_limit, len(records), bool(res.isolation))
        res.status = "timeout" if res.detail.startswith("CPU") else "crashed"
        return
    if outputs.get("exec_error"):
        res.status, res.detail = "exec_error", str(outputs["exec_error"])[:2000]
        return
    values = outputs.get("values")
    if not isinstance(values, list) or len(values) != len(expected):
        res.detail = "malformed result record"
        return
    res.status = "ok"
    for got, want in zip(values, expected):
        if isinstance(got, dict) and "value" in got and values_equal(got["value"], want):
            res.outcomes.append("pass")
            res.passed += 1
        elif isinstance(got, dict) and "value" in got:
            res.outcomes.append(f"fail: got {json.dumps(got['value'])[:200]}")
        else:
            res.outcomes.append(f"error: {str(got.get('error') if isinstance(got, dict) else got)[:200]}")
    res.detail = f"{res.passed}/{res.total} tests passed"


def _records(buf: bytes) -> list:
    """The result pipe's newline-separated JSON records (None for a line that is not JSON)."""
    out = []
    for line in bytes(buf).split(b"\n"):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append(None)
    return out


def _setup_record(buf: bytes) -> dict:
    """The isolation the harness reported before any untrusted code ran (the pipe's first record), or {}."""
    first = bytes(buf).split(b"\n", 1)
    if len(first) < 2:  # not yet complete
        return {}
    try:
        rec = json.loads(first[0])
    except ValueError:
        return {}
    iso = rec.get("isolation") if isinstance(rec, dict) and rec.get("kind") == "setup" else None
    return {str(k): str(v) for k, v in iso.items()} if isinstance(iso, dict) else {}


def _crash_detail(returncode: Optional[int], cpu: float, cpu_limit: int, n_records: int, had_setup: bool) -> str:
    if cpu >= cpu_limit - 0.05:
        return f"CPU limit of {cpu_limit} s (exit {returncode})"
    if not had_setup:
        return f"sandbox setup failed (exit {returncode})"
    if n_records > 2:
        return "result channel tampered with (extra records)"
    return f"no result: the program ended the harness (exit {returncode})"


# -------------------------------------------------------------------------------------------------- the harness
# Everything below runs in the child, as a script under `python -I -S`: standard library only.

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, AT_RECURSIVE, AT_FDCWD, SYS_mount_setattr = 1, 2, 0x8000, -100, 442
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
_HIDDEN_DIRS = ("/root", "/home")  # host homes: hidden, except the Python installation if it lives there
_SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run")  # world-writable places: replaced by fresh tmpfs


class _Libc:
    """The few libc calls the harness needs (Python 3.11 has no os.unshare); each returns True or False."""

    def __init__(self):
        import ctypes

        self.ctypes = ctypes
        self.lib = ctypes.CDLL(None, use_errno=True)

    def ok(self, rc: int) -> bool:
        return rc == 0

    def unshare(self, flags: int) -> bool:
        return self.ok(self.lib.unshare(flags))

    def mount(self, src: Optional[str], target: str, fstype: Optional[str], flags: int, data: str = "") -> bool:
        enc = (lambda s: s.encode() if s is not None else None)
        return self.ok(self.lib.mount(enc(src), target.encode(), enc(fstype), flags, enc(data) if data else None))

    def set_readonly(self, path: str) -> bool:
        """Recursively read-only and nosuid (mount_setattr, Linux >= 5.12); also makes propagation private."""
        c = self.ctypes
        attr = (c.c_uint64 * 4)(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, MS_PRIVATE, 0)
        return self.ok(self.lib.syscall(SYS_mount_setattr, AT_FDCWD, path.encode(), AT_RECURSIVE, attr, 32))

    def prctl(self, option: int, arg: int) -> bool:
        c = self.ctypes
        return self.ok(self.lib.prctl(option, c.c_ulong(arg), c.c_ulong(0), c.c_ulong(0), c.c_ulong(0)))

    def drop_capabilities(self) -> bool:
        c = self.ctypes
        for cap in range(64):  # the bounding set first (stops regaining them through exec), then the sets themselves
            self.prctl(PR_CAPBSET_DROP, cap)
        header = (c.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        data = (c.c_uint32 * 6)()
        return self.ok(self.lib.capset(header, data))


def _enter_user_namespace(libc: _Libc) -> bool:
    """Unprivileged callers: a user namespace mapping only our own uid/gid, which grants the right to unshare."""
    uid, gid = os.getuid(), os.getgid()
    if not libc.unshare(CLONE_NEWUSER):
        return False
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError:
        return False
    return True


def _private_filesystem(libc: _Libc, tmpfs_bytes: int) -> tuple[str, Optional[str]]:  # noqa: C901 - the namespace set-up steps in the order the kernel needs them (security code)
    """In the new mount namespace: read-only view of the host, fresh scratch tmpfs, hidden homes, new /proc.
    Returns the fs mode and the working directory (None: the namespace could not be set up)."""
    if not libc.set_readonly("/"):
        if not libc.mount(None, "/", None, MS_REC | MS_PRIVATE):
            return "permissions", None
        readonly = False
    else:
        readonly = True
    # Python's own files must stay readable when its prefix lives under a hidden home (e.g. ~/.pyenv).
    keep = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, os.path.dirname(sys.executable))}
    keep_fds = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in keep if os.path.isdir(p)}
    small = "size=1m,nr_inodes=256,mode=755"
    for hidden in _HIDDEN_DIRS:
        inner = [p for p in keep_fds if p.startswith(hidden + "/")]
        if not os.path.isdir(hidden) or not libc.mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV, small):
            continue
        for p in inner:
            os.makedirs(p, mode=0o755, exist_ok=True)
            libc.mount(f"/proc/self/fd/{keep_fds[p]}", p, None, MS_BIND | MS_REC)
        if readonly:
            libc.set_readonly(hidden)
    for fd in keep_fds.values():
        os.close(fd)
    scratch = f"size={max(tmpfs_bytes, 1 << 20)},nr_inodes=1024,mode=1777"
    for d in _SCRATCH_DIRS:
        if os.path.isdir(d) and not os.path.islink(d):
            libc.mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, scratch)
    workdir = "/tmp/sandbox"
    try:
        os.mkdir(workdir, 0o700)
    except OSError:
        return "permissions", None
    return ("mntns-ro" if readonly else "mntns"), workdir


def _install_guard(workdir: str, uid_isolated: bool) -> None:  # noqa: C901 - the audit hook's whole policy in one place, to be reviewed whole (security code)
    """PEP 578 audit hook for when namespaces are missing: refuse network, new programs, ctypes, writes outside
    ``workdir`` and (without a uid of its own) signals to processes other than itself and its children.
    Audit hooks cannot be removed from Python code; they are bypassable by memory corruption (see module doc)."""
    import posix
    from _thread import get_ident

    root = os.path.realpath(workdir) + os.sep
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    refused = ("socket.", "subprocess.", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "ctypes.", "pty.")
    # event -> positions of the paths it changes
    path_events = {"os.remove": (0,), "os.rename": (0, 1), "os.rmdir": (0,), "os.mkdir": (0,), "os.symlink": (1,),
                   "os.link": (1,), "os.truncate": (0,), "os.chmod": (0,), "os.chown": (0,), "os.utime": (0,),
                   "shutil.rmtree": (0,), "os.chflags": (0,), "os.setxattr": (0,), "os.removexattr": (0,)}
    me, realpath, fsdecode, busy = os.getpid, os.path.realpath, os.fsdecode, set()

    def inside(path: Any) -> bool:
        return (realpath(fsdecode(path)) + os.sep).startswith(root)

    def hook(event: str, args: tuple) -> None:  # noqa: C901 - one event filter: every allowed or refused event in one place (security code)
        if get_ident() in busy:  # the hook's own file reads
            return
        if event.startswith(refused):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open" and len(args) >= 3 and not isinstance(args[0], int):  # an int is an fd already held
            path, mode, flags = realpath(fsdecode(args[0])), args[1] or "", args[2] or 0
            if (any(m in str(mode) for m in "wax+") or flags & write_flags) and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} is not allowed")
            part = path[6:].split("/", 1)[0] if path.startswith("/proc/") else ""
            if part.isdigit() and int(part) != me():  # another process's environ, cmdline, memory...
                raise PermissionError(f"sandbox: reading {path!r} is not allowed")
        elif event in path_events:
            for i in path_events[event]:
                if i < len(args) and isinstance(args[i], (str, bytes, os.PathLike)) and not inside(args[i]):
                    raise PermissionError(f"sandbox: {event} outside the working directory is not allowed")
        elif event in ("os.kill", "os.killpg") and not uid_isolated and args[0] != me():
            busy.add(get_ident())
            try:
                child = _is_child(args[0])
            finally:
                busy.discard(get_ident())
            if not child:
                raise PermissionError(f"sandbox: signalling process {args[0]} is not allowed")

    def refuse(*_a, **_k):
        raise PermissionError("sandbox: leaving the session is not allowed")

    for mod in (os, posix):  # not audited: without them the session kill would miss escaped processes
        mod.setsid = mod.setpgid = refuse
    try:  # subprocess's fork+exec primitive is not audited either
        import _posixsubprocess

        _posixsubprocess.fork_exec = refuse
    except ImportError:
        pass
    sys.addaudithook(hook)
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
        sys.modules[name] = None  # importing it again fails; re-creating it needs dlopen, which the hook refuses


def _is_child(pid: int) -> bool:
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            return pid > 0 and int(f.read().rsplit(b")", 1)[1].split()[1]) == os.getpid()
    except (OSError, ValueError, IndexError):
        return False


def _set_limits(p: dict, nproc: int) -> None:
    import resource

    for lim, value in ((resource.RLIMIT_CPU, p["cpu_seconds"]), (resource.RLIMIT_AS, p["memory_bytes"]),
                       (resource.RLIMIT_FSIZE, p["max_file_bytes"]), (resource.RLIMIT_NPROC, nproc),
                       (resource.RLIMIT_NOFILE, 256), (resource.RLIMIT_CORE, 0)):
        # soft == hard: the PID-namespace init ignores SIGXCPU, so the hard limit's SIGKILL is what ends it.
        # Never above the current hard limit (an unprivileged process may only lower it).
        hard = resource.getrlimit(lim)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(lim, (value, value))


def _count_own_processes() -> int:
    uid, n = os.getuid(), 0
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.stat(f"/proc/{pid}").st_uid == uid:
                n += 1
        except OSError:
            pass
    return n


def _run_solution(code: str, calls: list[str], result_fd: int) -> None:
    """Execute the untrusted code and the test calls; write one outputs record. Only JSON crosses the pipe."""
    import builtins
    import traceback  # imported by _harness_main while the stdlib is readable

    record: dict = {"kind": "outputs", "exec_error": None, "values": []}
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(code, "<solution>", "exec"), namespace)
    except BaseException as e:  # SystemExit and KeyboardInterrupt included: the solution must not end the harness
        record["exec_error"] = "".join(traceback.format_exception_only(type(e), e)).strip()[:2000]
    if record["exec_error"] is None:
        for call in calls:
            try:
                value = eval(compile(call, "<test>", "eval"), namespace)
                record["values"].append('{"value": %s}' % json.dumps(value))
            except BaseException as e:
                record["values"].append(json.dumps({"error": f"{type(e).__name__}: {e}"[:500]}))
    text = ('{"kind": "outputs", "exec_error": %s, "values": [%s]}\n'
            % (json.dumps(record["exec_error"]), ", ".join(record["values"])))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    _write_all(result_fd, text.encode())
    os._exit(0)  # no atexit handlers, no lingering threads: the solution's code is done


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _harness_main(argv: list[str]) -> None:  # noqa: C901 - the child's start-up sequence, step by step, before the untrusted code runs
    import gc
    import signal
    import traceback  # noqa: F401  (used by _run_solution, after the stdlib may have become unreadable)

    result_fd = int(argv[1])
    p = json.loads(sys.stdin.buffer.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # stdin: EOF for the solution
    os.close(null)
    os.set_inheritable(result_fd, False)  # programs the solution might exec do not get it
    uid = p["uid"]
    iso = {"user": "same", "network": "none", "pid": "session", "fs": "permissions"}
    libc = _Libc()
    userns = False
    got: set = set()
    if p["namespaces"]:
        userns = os.geteuid() != 0 and _enter_user_namespace(libc)
        for name, flag in (("network", CLONE_NEWNET), ("fs", CLONE_NEWNS), ("pid", CLONE_NEWPID)):
            if libc.unshare(flag):
                got.add(name)
    if "pid" in got:
        child = os.fork()
        if child:  # outside the PID namespace: wait for its init and pass its status on
            for fd in (0, 1, 2, result_fd):
                os.close(fd)
            signal.signal(signal.SIGTERM, lambda *_: os.kill(child, 9))  # the parent's "end it" request
            _, status = os.waitpid(child, 0)
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)
        libc.prctl(PR_SET_PDEATHSIG, 9)
        iso["pid"] = "pidns"
    if "network" in got:
        iso["network"] = "netns"
    workdir = p["workdir"]
    if "fs" in got:
        mode, inner = _private_filesystem(libc, 4 * p["max_file_bytes"])
        iso["fs"] = mode
        if inner is not None:
            workdir = inner
            if "pid" in got:
                libc.mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            if uid is not None:
                os.chown(workdir, uid, uid)
    os.chdir(workdir)
    if uid is not None:
        nproc = p["max_processes"]
    elif userns:
        nproc = p["max_processes"]  # counted per user namespace: only this sandbox's processes
    else:
        nproc = _count_own_processes() + p["max_processes"]
    _set_limits(p, nproc)
    full = iso["network"] == "netns" and iso["fs"].startswith("mntns") and (uid is not None or iso["pid"] == "pidns")
    if not full:
        # Modules a solution commonly imports, loaded while the stdlib is surely readable (without the mount
        # namespace a fresh uid may not reach an interpreter installed under /root); socket so that it is the
        # guard, on every host, that refuses the network.
        for m in ("math", "itertools", "functools", "collections", "heapq", "bisect", "re", "string", "random",
                  "statistics", "fractions", "decimal", "operator", "copy", "typing", "socket", "encodings.idna"):
            __import__(m)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # from root to a non-zero uid: all capabilities are dropped too
        iso["user"] = f"uid {uid}"
    elif userns or os.geteuid() == 0:  # root without a usable fresh id keeps uid 0 but loses every capability
        if not libc.drop_capabilities():
            raise OSError("cannot drop capabilities; refusing to run untrusted code with them")
        iso["user"] = "userns" if userns else "root-no-caps"
    if not full:
        _install_guard(workdir, uid_isolated=uid is not None)
        iso["guard"] = "audit-hook"
    else:
        iso["guard"] = "off"
    del libc
    gc.collect()  # frees the ctypes function pointers the harness used, so the code cannot find them via gc
    _write_all(result_fd, (json.dumps({"kind": "setup", "isolation": iso}) + "\n").encode())
    _run_solution(p["code"], p["calls"], result_fd)


def _reap_main(uid: int) -> None:
    import time

    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    for _ in range(3):  # every process this uid may signal, i.e. the sandbox's, except this one
        os.kill(-1, 9)
        time.sleep(0.002)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--reap"]:
        _reap_main(int(sys.argv[2]))
    else:
        _harness_main(sys.argv)
