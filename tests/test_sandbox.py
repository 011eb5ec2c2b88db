"""The sandbox against hostile programs: each scores 0 within its time bound and leaves the host untouched.

Every hostile program runs twice: with the namespaces this kernel grants ("namespaces") and with them switched off
("fallback": the path taken where unshare is refused), so both layers of defence are exercised. A run must end
within its bound, score 0, leak no secret, create no file outside its working directory, leave this process and a
loopback server untouched, and leave no live process behind.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from brorl_lab.rollout import sandbox
from brorl_lab.rollout.sandbox import SandboxResult, UnitTest, run_untrusted

REPO = Path(sandbox.__file__).resolve().parents[1]
TESTS = [UnitTest("f(2)", 4), UnitTest("f(0)", 0), UnitTest("f(-3)", -6), UnitTest("f(10)", 20)]
WALL = 1.5  # seconds: the wall-clock limit hostile programs run under
SLACK = 2.5  # seconds a run may take beyond its limit (start-up, kill, sweep) on these shared 2 cores
MODES = ["namespaces", "fallback"]
IS_ROOT = os.geteuid() == 0


def run(code: str, mode: str, **kw) -> tuple[SandboxResult, float]:
    kw.setdefault("wall_timeout", WALL)
    t0 = time.monotonic()
    res = run_untrusted(textwrap.dedent(code), TESTS, namespaces=mode == "namespaces", **kw)
    return res, time.monotonic() - t0


def live_leftovers(res: SandboxResult) -> list[int]:
    """Live (non-zombie) processes still in the run's session or running as its uid."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()
            uids = next(l for l in Path(f"/proc/{name}/status").read_text().splitlines() if l.startswith("Uid:"))
        except (OSError, StopIteration, IndexError):
            continue
        state, pgrp, session = stat[0], int(stat[2]), int(stat[3])
        same_uid = res.sandbox_uid is not None and str(res.sandbox_uid) in uids.split()[1:]
        if state != b"Z" and (res.pid in (pgrp, session) or same_uid):
            found.append(int(name))
    return found


def assert_contained(res: SandboxResult, elapsed: float, bound: float, *secrets: str) -> None:
    assert res.fraction == 0.0 and res.passed == 0, res
    assert elapsed < bound, f"took {elapsed:.2f} s > {bound} s: {res}"
    text = " ".join([res.stdout, res.stderr, res.detail, *res.outcomes, str(res.isolation)])
    for s in secrets:
        assert s not in text, f"secret leaked: {res}"
    assert not live_leftovers(res), f"processes left behind: {live_leftovers(res)}"
    os.kill(os.getpid(), 0)  # this process is alive and signalable


# ---- honest programs ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_correct_solution_scores_one_and_partial_scores_the_fraction(mode):
    res, _ = run("def f(x):\n    return 2 * x\n", mode)
    assert (res.status, res.passed, res.total, res.fraction) == ("ok", 4, 4, 1.0)
    res, _ = run("def f(x):\n    print('dbg', x)\n    return 2 * x if x > 0 else 1 // x\n", mode)
    assert (res.status, res.passed, res.fraction) == ("ok", 2, 0.5)
    assert res.outcomes[:3] == ["pass", "error: ZeroDivisionError: integer division or modulo by zero", "fail: got -1"]
    assert res.stdout.startswith("dbg 2\n")  # stdout is captured, not mistaken for the result


@pytest.mark.parametrize("mode", MODES)
def test_working_directory_is_empty_writable_private_and_removed(mode):
    res, _ = run("""
        import json, os
        seen = sorted(os.listdir('.'))
        with open('scratch.txt', 'w') as fh:
            fh.write('hello')
        print(json.dumps({'seen': seen, 'back': open('scratch.txt').read(), 'cwd': os.getcwd(),
                          'env': sorted(os.environ), 'stdin': os.read(0, 10).decode()}))
        """, mode)
    assert res.status == "ok", res
    info = json.loads(res.stdout)
    assert info["seen"] == [] and info["back"] == "hello" and info["stdin"] == ""  # empty dir; stdin at EOF
    assert set(info["env"]) <= {"LC_CTYPE"}  # no host variable (Python itself may set its locale coercion)
    assert not Path(info["cwd"], "scratch.txt").exists()  # removed afterwards, or only ever on a private tmpfs


@pytest.mark.parametrize("mode", MODES)
def test_file_size_cpu_and_memory_limits_apply(mode):
    res, _ = run("open('big', 'wb').write(b'x' * 300_000)\n", mode, max_file_bytes=100_000)
    assert res.status == "exec_error" and "File too large" in res.detail, res
    res, elapsed = run("while True:\n    pass\n", mode, wall_timeout=6.0, cpu_seconds=1)
    assert res.status == "timeout" and res.detail.startswith("CPU limit") and elapsed < 6.0, res
    res, _ = run("xs = []\nwhile True:\n    xs.append(bytearray(1 << 24))\n", mode, memory_mb=128)
    assert res.status == "exec_error" and "MemoryError" in res.detail, res


# ---- hostile programs ---------------------------------------------------------------------------------------------
HOSTILE = {
    "infinite_loop": "while True:\n    pass\n",
    "sleep_past_limit": "import time\ntime.sleep(60)\ndef f(x):\n    return 2 * x\n",
    "fork_bomb": """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
    "fork_bomb_leaving_the_session": """
        import os, time
        for _ in range(64):
            try:
                if os.fork() == 0:
                    try:
                        os.setsid()
                    except Exception:
                        pass
                    time.sleep(60)
            except OSError:
                pass
        time.sleep(60)
        """,
    "memory_bomb": "hog = bytearray(1 << 36)\ndef f(x):\n    return 2 * x\n",
    "huge_output": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
    "huge_stderr_via_fd": "import os\nwhile True:\n    os.write(2, b'y' * 65536)\n",
    "kill_parent": """
        import os, signal
        try:
            os.kill(os.getppid(), signal.SIGKILL)
        except Exception:
            pass
        def f(x):
            return -1
        """,
    "forge_result_on_stdout": """
        print('{"kind": "outputs", "exec_error": null, "values": [{"value": 4}, {"value": 0}, {"value": -6}, '
              '{"value": 20}]}')
        print('4/4 tests passed')
        def f(x):
            return 'wrong'
        """,
    # The result fd carries return values, compared with expected values that never enter the sandbox: a forged
    # record can only "pass" by containing the right answers, i.e. by solving the tests.
    "forge_result_on_every_fd": """
        import os
        fake = b'{"kind": "outputs", "exec_error": null, "passed": 4, "values": [{"value": "pass"}, ' \\
               b'{"value": "pass"}, {"value": "pass"}, {"value": "pass"}]}\\n'
        for fd in range(3, 256):
            try:
                os.write(fd, fake)
            except OSError:
                pass
        os._exit(0)
        """,
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_scores_zero_in_bounded_time(name, mode):
    res, elapsed = run(HOSTILE[name], mode)
    assert_contained(res, elapsed, WALL + SLACK)
    expected = {"infinite_loop": {"timeout"}, "sleep_past_limit": {"timeout"}, "fork_bomb": {"timeout"},
                "fork_bomb_leaving_the_session": {"timeout"}, "memory_bomb": {"exec_error"},
                "huge_output": {"output_limit"}, "huge_stderr_via_fd": {"output_limit"},
                "kill_parent": {"ok", "crashed"}, "forge_result_on_stdout": {"ok"},
                "forge_result_on_every_fd": {"ok", "crashed"}}[name]
    assert res.status in expected, res
    if name.startswith("huge"):
        assert res.output_truncated and len(res.stdout) + len(res.stderr) <= 64 << 10
    if name == "kill_parent" and res.status == "ok":
        assert res.outcomes == ["fail: got -1"] * 4


def test_fork_bomb_is_capped_by_the_process_limit():
    code = """
        import os, time
        n = 0
        for _ in range(40):
            try:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                n += 1
            except OSError:
                break
        def f(x):
            return n
        """
    if not IS_ROOT:
        pytest.skip("RLIMIT_NPROC counts all of a non-root caller's processes; asserted as root (a fresh uid)")
    for mode in MODES:
        res, _ = run(code, mode, max_processes=6)
        assert res.outcomes[0] == "fail: got 5", res  # 6 processes: the harness and 5 children
        assert not live_leftovers(res)


@pytest.fixture
def loopback_server():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.setblocking(False)
    yield srv
    srv.close()


@pytest.mark.parametrize("mode", MODES)
def test_network_is_unreachable(mode, loopback_server):
    port = loopback_server.getsockname()[1]
    res, elapsed = run(f"""
        import os, socket
        results = []
        try:
            results.append(socket.create_connection(('127.0.0.1', {port}), timeout=1).getpeername())
        except Exception as e:
            results.append(type(e).__name__)
        try:  # a shell reaching the network on its own
            results.append(os.system("bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED'"))
        except Exception as e:
            results.append(type(e).__name__)
        print(results)
        """, mode)
    assert_contained(res, elapsed, WALL + SLACK)
    assert "CONNECTED" not in res.stdout
    with pytest.raises(BlockingIOError):  # nobody knocked
        loopback_server.accept()
    want = "netns" if mode == "namespaces" and res.isolation.get("network") == "netns" else "none"
    assert res.isolation["network"] == want
    if want == "none":
        assert res.isolation["guard"] == "audit-hook" and "PermissionError" in res.stdout, res


@pytest.mark.parametrize("mode", MODES)
def test_writes_outside_the_working_directory_do_not_reach_the_host(mode):
    token = uuid.uuid4().hex
    targets = [f"/tmp/brorl-hostile-{token}", str(REPO / f"hostile-{token}"), f"/var/tmp/brorl-hostile-{token}",
               f"/dev/shm/brorl-hostile-{token}"]
    res, elapsed = run(f"""
        import os, shutil
        for path in {targets!r}:
            for write in (lambda: open(path, 'w').write('pwned'), lambda: os.mkdir(path + '.d'),
                          lambda: os.symlink('/etc/passwd', path + '.lnk'),
                          lambda: (open('here', 'w').close(), os.rename('here', path + '.mv')),
                          lambda: os.system('echo pwned > ' + path + '.sh')):
                try:
                    write()
                except Exception as e:
                    print(type(e).__name__)
        """, mode)
    assert_contained(res, elapsed, WALL + SLACK)
    for t in targets:
        for suffix in ("", ".d", ".lnk", ".mv", ".sh"):
            assert not os.path.lexists(t + suffix), f"{t + suffix} was created ({res})"


@pytest.mark.parametrize("mode", MODES)
def test_host_files_and_environment_stay_secret(mode, monkeypatch):
    if mode == "fallback" and not IS_ROOT:
        pytest.skip("without namespaces a non-root sandbox runs as the caller and can read the caller's files")
    secret_env, secret_file = f"env-{uuid.uuid4().hex}", f"file-{uuid.uuid4().hex}"
    monkeypatch.setenv("BRORL_TEST_SECRET", secret_env)
    folder = tempfile.mkdtemp(prefix="brorl-secret-")
    try:
        # World-readable with namespaces (the mount namespace hides /tmp); root-only for the fallback (the fresh uid
        # cannot read it; a world-readable file is readable there: see the Safety notes).
        os.chmod(folder, 0o755 if mode == "namespaces" else 0o700)
        path = Path(folder, "secret.txt")
        path.write_text(secret_file)
        path.chmod(0o644 if mode == "namespaces" else 0o600)
        res, elapsed = run(f"""
            import os
            found = [repr(dict(os.environ))]
            for p in [{str(path)!r}, '/proc/self/environ'] + ['/proc/%s/environ' % q for q in os.listdir('/proc')
                                                             if q.isdigit()]:
                try:
                    found.append(open(p, 'rb').read().decode('latin-1'))
                except Exception as e:
                    found.append(type(e).__name__)
            print(found)
            def f(x):
                return found
            """, mode)
        assert_contained(res, elapsed, WALL + SLACK, secret_env, secret_file)
    finally:
        shutil.rmtree(folder)


# ---- isolation modes, non-root callers, arguments -----------------------------------------------------------------
def _probe(*cmd: str) -> str:
    p = subprocess.run(["unshare", *cmd, "true"], capture_output=True, text=True, timeout=20)
    return "" if p.returncode == 0 else (p.stderr.strip() or f"exit {p.returncode}")


def test_isolation_modes_reported():
    res, _ = run("def f(x):\n    return 2 * x\n", "fallback")
    assert res.isolation == {"user": f"uid {res.sandbox_uid}" if IS_ROOT else "same", "network": "none",
                             "pid": "session", "fs": "permissions", "guard": "audit-hook"}
    why = "no unshare binary" if shutil.which("unshare") is None else (
        _probe("-n", "-p", "-f", "-m") if IS_ROOT else _probe("-U", "-r", "-n", "-p", "-f", "-m"))
    if why:
        pytest.skip(f"this kernel refuses the namespaces ({why}); every mode='fallback' test covers the fallback")
    res, _ = run("def f(x):\n    return 2 * x\n", "namespaces")
    assert res.fraction == 1.0
    assert res.isolation == {"user": f"uid {res.sandbox_uid}" if IS_ROOT else "userns", "network": "netns",
                             "pid": "pidns", "fs": "mntns-ro", "guard": "off"}


NON_ROOT_SCRIPT = """
import json, os, socket, sys
from brorl_lab.rollout.sandbox import UnitTest, run_untrusted
port, marker = int(sys.argv[1]), sys.argv[2]
tests = [UnitTest("f(2)", 4)]
out = {"uid": os.geteuid()}
for name, code in {
    "correct": "def f(x):\\n    return 2 * x\\n",
    "network": f"import socket\\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\\n",
    "write": f"open({marker!r}, 'w').write('x')\\n",
    "kill_parent": "import os\\nos.kill(os.getppid(), 9)\\n",
}.items():
    for ns in (True, False):
        r = run_untrusted(code, tests, wall_timeout=3.0, namespaces=ns)
        out[f"{name}/{ns}"] = [r.status, r.fraction, r.isolation, r.detail]
print(json.dumps(out))
"""


def test_non_root_caller_gets_a_user_namespace_or_the_guard(loopback_server):
    """As an unprivileged caller (a user namespace mapping uid 1000 when this test runs as root) the sandbox enters
    its own user namespace; with namespaces off it relies on the audit-hook guard alone."""
    if IS_ROOT:
        if shutil.which("unshare") is None or _probe("-U", "--map-user=1000", "--map-group=1000"):
            pytest.skip("cannot become a non-root caller here: this kernel refuses user namespaces")
        prefix = ["unshare", "-U", "--map-user=1000", "--map-group=1000"]
    else:
        prefix = []
    port = loopback_server.getsockname()[1]
    marker = f"/tmp/brorl-nonroot-{uuid.uuid4().hex}"
    p = subprocess.run([*prefix, sys.executable, "-c", NON_ROOT_SCRIPT, str(port), marker], capture_output=True,
                       text=True, timeout=60, cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["uid"] != 0
    for ns in ("True", "False"):
        assert out[f"correct/{ns}"][:2] == ["ok", 1.0], out
        for hostile in ("network", "write", "kill_parent"):
            assert out[f"{hostile}/{ns}"][1] == 0.0, out
    assert out["correct/False"][2]["guard"] == "audit-hook" and out["correct/False"][2]["user"] == "same"
    if not _probe("-U", "-r", "-n", "-p", "-f", "-m"):
        assert out["correct/True"][2] == {"user": "userns", "network": "netns", "pid": "pidns", "fs": "mntns-ro",
                                          "guard": "off"}
    assert "sandbox: socket" in out["network/False"][3] and "sandbox: writing" in out["write/False"][3], out
    assert not os.path.exists(marker)
    with pytest.raises(BlockingIOError):
        loopback_server.accept()


def test_leftover_sweeps_kill_the_uid_and_remove_its_files():
    if not IS_ROOT:
        pytest.skip("sweeping by uid needs root (only root callers run the sandbox under a fresh uid)")
    uid = sandbox._fresh_id()
    owned, other = tempfile.mkdtemp(prefix="brorl-owned-"), tempfile.mkdtemp(prefix="brorl-other-")
    parent = tempfile.mkdtemp(prefix="brorl-sweep-")
    try:
        os.rename(owned, os.path.join(parent, "owned"))
        os.rename(other, os.path.join(parent, "other"))
        os.chown(os.path.join(parent, "owned"), uid, uid)
        Path(parent, "file").write_text("x")
        os.chown(os.path.join(parent, "file"), uid, uid)
        removed = sandbox._remove_owned(uid, [parent])
        assert sorted(removed) == sorted([os.path.join(parent, "owned"), os.path.join(parent, "file")])
        assert os.listdir(parent) == ["other"]
        sleeper = subprocess.Popen(["sleep", "30"], user=uid, group=uid, start_new_session=True)
        assert sandbox._uid_processes(uid) == [sleeper.pid]
        sandbox._reap_uid(uid)
        assert sleeper.wait(timeout=5) == -9 and sandbox._uid_processes(uid) == []
    finally:
        shutil.rmtree(parent)


@pytest.mark.parametrize("kwargs, match", [
    (dict(wall_timeout=0), "wall_timeout"), (dict(wall_timeout=float("inf")), "wall_timeout"),
    (dict(cpu_seconds=-1), "cpu_seconds"), (dict(memory_mb=16), "memory_mb"), (dict(memory_mb=1.5), "memory_mb"),
    (dict(max_output_bytes=0), "max_output_bytes"), (dict(max_file_bytes=True), "max_file_bytes"),
    (dict(max_processes=0), "max_processes"),
])
def test_bad_limits_raise_one_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_untrusted("pass", TESTS, **kwargs)


def test_bad_code_or_tests_raise_one_clear_error():
    with pytest.raises(ValueError, match="code must be a str"):
        run_untrusted(b"pass", TESTS)
    with pytest.raises(ValueError, match=r"tests\[1\] must be a UnitTest"):
        run_untrusted("pass", [TESTS[0], ("f(1)", 2)])
    with pytest.raises(ValueError, match=r"tests\[0\].expected must be JSON-compatible"):
        run_untrusted("pass", [UnitTest("f(1)", {1, 2})])
    with pytest.raises(ValueError, match="tests must be a sequence"):
        run_untrusted("pass", "f(1)")


def test_values_equal_is_strict_about_types_but_tolerant_of_float_rounding():
    eq = sandbox.values_equal
    assert eq(0.1 + 0.2, 0.3) and eq(2, 2.0) and eq([1, {"a": [2]}], [1, {"a": [2]}])
    assert not eq(True, 1) and not eq(1, True) and not eq("1", 1) and not eq([1], [1, 2]) and not eq(None, 0)
    assert not eq({"a": 1}, {"b": 1})


@pytest.mark.parametrize("mode", MODES)
def test_root_without_a_spare_id_runs_the_code_without_capabilities(mode, monkeypatch):
    """A container that maps too few ids leaves no fresh uid: the code then keeps uid 0 but loses every capability
    (and, in the fallback, the guard also refuses signals to foreign processes)."""
    if not IS_ROOT:
        pytest.skip("only root callers switch to a fresh uid; nothing to take away otherwise")
    monkeypatch.setattr(sandbox, "_fresh_id", lambda: None)
    res, _ = run("""
        import os
        caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapPrm', 'CapBnd'))]
        try:
            os.kill(1, 0)
            probe = 'signalled init'
        except Exception as e:
            probe = type(e).__name__
        def f(x):
            return [os.geteuid(), caps, probe]
        """, mode)
    assert res.isolation["user"] == "root-no-caps" and res.sandbox_uid is None
    assert res.outcomes[0] == 'fail: got [0, ["0000000000000000", "0000000000000000", "0000000000000000"], ' + (
        '"signalled init"]' if mode == "namespaces" else '"PermissionError"]'), res


def test_concurrent_runs_from_threads_stay_independent():
    """Scoring may run sandboxes from a thread pool: each run has its own pipes, uid and result."""
    from concurrent.futures import ThreadPoolExecutor

    def one(k: int) -> SandboxResult:
        return run_untrusted(f"def f(x):\n    return 2 * x if {k} % 2 == 0 else x\n", TESTS, wall_timeout=10.0)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(8)))
    assert [r.passed for r in results] == [4, 1] * 4  # the odd ones only get f(0) == 0 right
    if IS_ROOT:
        assert len({r.sandbox_uid for r in results}) == 8
