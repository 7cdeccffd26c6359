"""The sandbox against hostile programs: each one contained, with the right verdict, in time.

Every program here really runs (real child processes, a real listening socket, real files). The
containment checks that need the namespace / uid isolation are skipped, with the reason, on a
machine where the sandbox reports a degraded mode.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time

import pytest

from jaxrl_mt.tasks.isolation import isolation
from jaxrl_mt.tasks.sandbox import SandboxLimits, check_code, run_python

FAST = SandboxLimits(timeout_s=2.0)
MARGIN_S = 1.5  # start-up, kill and reap on a loaded 2-core machine


def _need(*modes: str) -> None:
    iso = isolation()
    if iso.mode not in modes:
        pytest.skip(f"sandbox isolation here is {iso.label!r}; this containment needs mode {'/'.join(modes)}")


def _throwaway_uid_alive(pids: list[int]) -> list[int]:
    """The pids among ``pids`` that are live processes of a sandbox (throwaway) uid."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", encoding="utf-8") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        uid = int(fields["Uid"].split()[0])
        if fields["State"].split()[0] != "Z" and 2_000_000 <= uid < 2_000_000 + (1 << 20):
            alive.append(pid)
    return alive


def test_well_behaved_program_passes_and_reports_isolation():
    r = run_python("import sys\nprint('hello', sys.flags.isolated, sys.flags.dont_write_bytecode)", limits=FAST)
    assert r.verdict == "passed" and r.reason == ""
    assert r.stdout == "hello 1 1\n"
    assert r.returncode == 0 and 0 < r.wall_s < FAST.timeout_s
    assert r.isolation == isolation().label


def test_infinite_loop_times_out_within_the_limit():
    r = run_python("while True:\n    pass\n", limits=FAST)
    assert r.verdict == "timeout", r
    assert FAST.timeout_s <= r.wall_s <= FAST.timeout_s + MARGIN_S


def test_fork_bomb_is_bounded_and_every_process_is_gone():
    if isolation().mode == "none" and os.geteuid() == 0:
        pytest.skip("as root without a throwaway uid RLIMIT_NPROC does not bind: a fork bomb would not be bounded")
    bomb = (
        "import os, sys\n"
        "while True:\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            print(os.getpid(), flush=True)\n"
        "    except OSError:\n"
        "        pass\n"
    )
    r = run_python(bomb, limits=FAST)
    assert r.verdict in ("timeout", "crashed"), r
    assert r.wall_s <= FAST.timeout_s + MARGIN_S
    pids = [int(x) for x in r.stdout.split() if x.isdigit()]
    assert 0 < len(pids) < FAST.max_processes  # the bomb ran, and RLIMIT_NPROC bounded it
    time.sleep(0.1)
    assert _throwaway_uid_alive(pids) == []
    after = run_python("print(6 * 7)", limits=FAST)  # the machine and the sandbox still work
    assert after.verdict == "passed" and after.stdout == "42\n"


def test_ten_gigabyte_allocation_fails_inside():
    r = run_python("x = bytearray(10 * 1024 ** 3)\nprint('allocated')", limits=FAST)
    assert r.verdict == "crashed" and "MemoryError" in r.reason
    assert "allocated" not in r.stdout


def test_writes_outside_the_work_directory_leave_nothing(tmp_path):
    _need("full")
    name = f"jaxrl_sandbox_escape_{secrets.token_hex(4)}"
    targets = [
        tmp_path / "escape.txt",
        f"/tmp/{name}",
        f"/var/tmp/{name}",
        f"/dev/shm/{name}",
        f"../{name}",
        f"../../{name}",
    ]
    prog = (
        "import os\n"
        f"targets = {[str(t) for t in targets]!r}\n"
        "wrote = []\n"
        "for t in targets:\n"
        "    try:\n"
        "        with open(t, 'w') as f:\n"
        "            f.write('pwned')\n"
        "        wrote.append(t)\n"
        "    except OSError as e:\n"
        "        print('refused', t, e.strerror)\n"
        "open('inside.txt', 'w').write('fine')\n"
        "print('inside', open('inside.txt').read(), os.listdir('.'))\n"
        "assert not wrote, wrote\n"
    )
    r = run_python(prog, limits=FAST)
    assert r.verdict == "passed", r
    assert r.stdout.count("refused") == len(targets)
    assert "inside fine ['inside.txt']" in r.stdout  # its own work directory is writable
    for t in targets[:4]:
        assert not os.path.exists(t)
    assert not any(p.startswith("jaxrl_sandbox_escape") for p in os.listdir("/tmp"))
    assert list(tmp_path.iterdir()) == []


def test_environment_secret_is_invisible(monkeypatch):
    secret = f"s3cr3t-{secrets.token_hex(8)}"
    monkeypatch.setenv("JAXRL_SECRET", secret)
    prog = (
        "import os\n"
        "print(sorted(os.environ))\n"
        "print(os.environ.get('JAXRL_SECRET'))\n"
        "for path in (f'/proc/{os.getppid()}/environ', '/proc/1/environ'):\n"
        "    try:\n"
        "        print(open(path, 'rb').read())\n"
        "    except OSError as e:\n"
        "        print('refused', path, e.strerror)\n"
    )
    r = run_python(prog, limits=FAST)
    assert r.verdict == "passed", r
    assert r.stdout.splitlines()[0] == "['HOME', 'LANG', 'LC_ALL', 'PATH', 'TMPDIR']"
    assert r.stdout.splitlines()[1] == "None"
    if isolation().mode == "uid":  # another uid may not read a process's environment
        assert r.stdout.count("refused") == 2
    if isolation().mode == "full":  # no parent in its PID namespace; PID 1 is the program itself
        assert "refused /proc/0/environ" in r.stdout
        assert r.stdout.splitlines()[3].startswith("b'PATH=/usr/bin:/bin\\x00LANG=C.UTF-8")
    if isolation().mode in ("full", "uid"):
        assert secret not in r.stdout and secret not in r.stderr
    # mode "none" runs the child as the calling user, who can read /proc/<parent>/environ


def test_socket_to_a_real_local_listener_fails():
    _need("full")
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        srv.settimeout(0.2)
        port = srv.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=2):  # the listener really accepts
            srv.accept()[0].close()
        r = run_python(
            f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')",
            limits=FAST,
        )
        with pytest.raises(socket.timeout):
            srv.accept()  # nothing reached it
    assert r.verdict == "crashed" and "connected" not in r.stdout
    assert "Network is unreachable" in r.reason or "Errno" in r.reason


def test_os_system_runs_but_cannot_touch_anything_outside():
    _need("full")
    outside = f"/tmp/jaxrl_sandbox_touch_{secrets.token_hex(4)}"
    prog = f"import os\nprint(os.system('touch {outside}') != 0, flush=True)\nprint(os.system('touch inside.txt && ls') == 0)\n"
    r = run_python(prog, limits=FAST)
    assert r.verdict == "passed", r
    assert r.stdout.split() == ["True", "inside.txt", "True"]  # the shell works, inside only
    assert not os.path.exists(outside)


def test_deleting_files_outside_fails_and_they_survive(tmp_path):
    _need("full")  # with a uid alone, a file in a world-writable directory could be deleted
    victim_dir = f"/tmp/jaxrl_sandbox_victim_{secrets.token_hex(4)}"
    os.makedirs(victim_dir)
    os.chmod(victim_dir, 0o777)  # even a world-writable directory must survive
    try:
        victims = [os.path.join(victim_dir, "keep.txt"), str(tmp_path / "keep.txt")]
        for v in victims:
            with open(v, "w") as f:
                f.write("keep")
            os.chmod(v, 0o666)
        prog = (
            "import os, shutil\n"
            f"for v in {victims!r}:\n"
            "    try:\n"
            "        os.remove(v)\n"
            "    except OSError as e:\n"
            "        print('refused', e.strerror)\n"
            f"shutil.rmtree({victim_dir!r}, ignore_errors=True)\n"
        )
        r = run_python(prog, limits=FAST)
        assert r.verdict == "passed", r
        assert r.stdout.count("refused") == 2
        for v in victims:
            with open(v) as f:
                assert f.read() == "keep"
    finally:
        shutil.rmtree(victim_dir, ignore_errors=True)


def test_leaving_early_never_passes():
    assert run_python("import os\nos._exit(0)\nassert False", limits=FAST).verdict == "crashed"
    strict = run_python("import sys\nsys.exit(0)\nassert False", limits=FAST, allow_exit=False)
    assert strict.verdict == "crashed" and "sys.exit" in strict.reason
    assert run_python("import sys\nprint(1)\nsys.exit()", limits=FAST).verdict == "passed"
    assert run_python("raise SystemExit(3)", limits=FAST).verdict == "crashed"


def test_failed_assertion_names_the_line_and_exceptions_crash():
    r = run_python("def f(x):\n    return x + 1\n\nassert f(1) == 2\nassert f(2) == 4, 'f(2)'\n", limits=FAST)
    assert r.verdict == "failed" and r.reason == "line 5: assert f(2) == 4, 'f(2)' -> AssertionError: f(2)"
    c = run_python("def f():\n    return {}['k']\nf()\n", limits=FAST)
    assert c.verdict == "crashed" and c.reason.startswith("line 2: return {}['k'] -> KeyError")


def test_stdin_is_given_or_closed():
    assert run_python("print(input().upper())", stdin="abc\n", limits=FAST).stdout == "ABC\n"
    r = run_python("import sys\nprint(repr(sys.stdin.read()))", limits=FAST)
    assert r.verdict == "passed" and r.stdout == "''\n"


def test_output_is_read_with_a_cap():
    limits = SandboxLimits(timeout_s=2.0, max_output_bytes=10_000)
    r = run_python("while True:\n    print('x' * 1000)\n", limits=limits)
    assert r.verdict == "crashed" and r.reason.startswith("stdout over 10000 bytes")
    assert len(r.stdout) <= 10_000 + 65536 and r.wall_s < limits.timeout_s


@pytest.mark.parametrize(
    "code, why",
    [
        ("", "empty code"),
        ("   \n", "empty code"),
        ("def f(:\n", "syntax error: line 1"),
        ("x = 'a\0b'", "the code contains a NUL byte"),
        ("x = 'a\\0b'", ""),
    ],
)
def test_rejected_before_running(code, why):
    r = run_python(code, limits=FAST)
    if why:
        assert r.verdict == "rejected" and r.reason.startswith(why) and r.returncode is None and r.wall_s == 0.0
        assert check_code(code).startswith(why)
    else:
        assert r.verdict == "passed"


def test_code_over_the_size_cap_is_rejected():
    r = run_python("x = 1\n" * 100, limits=SandboxLimits(max_code_bytes=100))
    assert r.verdict == "rejected" and "over the 100-byte cap" in r.reason


def test_the_test_process_is_unharmed():
    _need("full", "uid")  # as the same uid, a sandboxed program could signal the test process
    pid, cwd, env = os.getpid(), os.getcwd(), dict(os.environ)
    run_python("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", limits=FAST)
    run_python("import os\nos.chdir('/')\nos.environ.clear()", limits=FAST)
    assert (os.getpid(), os.getcwd(), dict(os.environ)) == (pid, cwd, env)
    done = subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout == "1\n"


def test_concurrent_runs_from_threads_stay_apart():
    from concurrent.futures import ThreadPoolExecutor

    prog = "import os\nopen('mine.txt', 'w').write('{i}')\nprint(sorted(os.listdir('.')), open('mine.txt').read(), os.getuid())"
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: run_python(prog.format(i=i), limits=SandboxLimits(timeout_s=30.0)), range(6)))
    assert [r.verdict for r in results] == ["passed"] * 6
    outs = [r.stdout.split() for r in results]
    assert [o[:2] for o in outs] == [["['mine.txt']", str(i)] for i in range(6)]  # each its own fresh directory
    if isolation().mode in ("full", "uid"):
        assert len({o[2] for o in outs}) == 6  # a throwaway uid each
