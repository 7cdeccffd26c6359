"""What sandboxed code can reach of the host: no Unix socket, no other process, no host file.

Issue 32, failure 4: before the PID namespace and the minimal root, sandboxed code connected to a
world-writable Unix socket under a host temp directory and read its reply, listed every host
process and read their command lines (the parent's included), and read world-readable host files.
Each test builds the real bait (a listening socket, a process with a token on its command line, a
file) and runs a real sandboxed program against it.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys

import pytest

from jaxrl_mt.tasks import isolation as iso
from jaxrl_mt.tasks.sandbox import SandboxLimits, run_python

FAST = SandboxLimits(timeout_s=5.0)


@pytest.fixture(autouse=True)
def _full_only():
    if iso.isolation().mode != "full":
        pytest.skip(f"sandbox isolation here is {iso.isolation().label!r}; these checks need mode full")


@pytest.fixture
def open_dir(tmp_path):
    """A world-writable host directory, as an attacker would find one (every parent searchable)."""
    for d in [tmp_path, *tmp_path.parents]:
        if not os.stat(d).st_mode & 0o001:
            os.chmod(d, os.stat(d).st_mode | 0o005)
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    return d


def _listener(sock: socket.socket) -> socket.socket:
    sock.listen(4)
    sock.settimeout(0.3)
    return sock


def test_host_unix_sockets_cannot_be_reached(open_dir):
    path = str(open_dir / "agent.sock")
    abstract = f"\0jaxrl_sandbox_bait_{secrets.token_hex(4)}"
    with socket.socket(socket.AF_UNIX) as srv, socket.socket(socket.AF_UNIX) as asrv:
        srv.bind(path)
        os.chmod(path, 0o777)
        asrv.bind(abstract)
        _listener(srv), _listener(asrv)
        with socket.socket(socket.AF_UNIX) as c:  # the bait really accepts: a host process gets in
            c.connect(path)
            srv.accept()[0].close()
        prog = (
            "import socket\n"
            f"for target in ({path!r}, {abstract!r}):\n"
            "    s = socket.socket(socket.AF_UNIX)\n"
            "    try:\n"
            "        s.connect(target)\n"
            "        print('connected', s.recv(64))\n"
            "    except OSError as e:\n"
            "        print('refused', e.errno)\n"
            "import os\n"
            f"print(os.path.exists({str(open_dir)!r}), sorted(os.listdir('/tmp')))\n"
        )
        r = run_python(prog, limits=FAST)
        for s in (srv, asrv):
            with pytest.raises(socket.timeout):
                s.accept()  # nothing reached either listener
    assert r.verdict == "passed", r
    lines = r.stdout.splitlines()
    # ENOENT: the path does not exist in its root; ECONNREFUSED: its own network namespace has no such name
    assert lines[:2] == ["refused 2", "refused 111"], r.stdout
    assert lines[2].startswith("False ['jaxrl_sandbox_") and lines[2].count("'") == 2, lines  # its own dir only


def test_proc_lists_only_its_own_processes_and_no_host_command_line():
    token = f"tok-{secrets.token_hex(8)}"
    bait = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"https://u:{token}@example"])
    try:
        prog = (
            "import os, subprocess, time\n"
            "kid = subprocess.Popen(['sleep', '30'])\n"
            "while open(f'/proc/{kid.pid}/cmdline', 'rb').read() != b'sleep\\x0030\\x00':\n"
            "    time.sleep(0.005)\n"
            "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
            "print(os.getpid(), os.getppid(), kid.pid, pids)\n"
            "seen = b''\n"
            "for p in pids:\n"
            "    seen += open(f'/proc/{p}/cmdline', 'rb').read() + b'|'\n"
            "print(seen)\n"
            f"for pid in ({os.getpid()}, {bait.pid}):\n"
            "    try:\n"
            "        print(open(f'/proc/{pid}/cmdline', 'rb').read())\n"
            "    except OSError as e:\n"
            "        print('refused', e.errno)\n"
            "kid.kill()\n"
        )
        r = run_python(prog, limits=FAST)
    finally:
        bait.kill()
        bait.wait()
    assert r.verdict == "passed", r
    head, seen, *refused = r.stdout.splitlines()
    pid, ppid, kid, pids = head.split(" ", 3)
    assert (pid, ppid) == ("1", "0")  # PID 1 of its own namespace; no parent visible
    assert pids == f"[1, {kid}]"  # itself and its own child: nothing else
    assert seen.startswith("b'/usr/bin/python3\\x00-I\\x00-B\\x00-c") or seen.startswith(f"b'{iso.isolation().python}")
    assert seen.endswith("|sleep\\x0030\\x00|'"), seen
    assert token not in r.stdout and "pytest" not in r.stdout
    assert refused == ["refused 2", "refused 2"]  # the test process and the bait: no such pid there


def test_world_readable_host_files_are_not_there(open_dir):
    bait = open_dir / "notes.txt"
    secret = f"secret-{secrets.token_hex(8)}"
    bait.write_text(secret)
    bait.chmod(0o644)
    prog = (
        "import os, json, sqlite3\n"  # the standard library (and its C extensions) still loads
        f"for path in ({str(bait)!r}, '/etc/hostname', '/etc/passwd', '/root', '/work', '/home', '/var'):\n"
        "    try:\n"
        "        print(open(path).read()[:40] if os.path.isfile(path) else os.listdir(path))\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)\n"
        "print(sorted(os.listdir('/')), sorted(os.listdir('/dev')), sorted(os.listdir('/etc')))\n"
    )
    r = run_python(prog, limits=FAST)
    assert r.verdict == "passed", r
    lines = r.stdout.splitlines()
    assert lines[:7] == ["refused 2"] * 7, r.stdout
    assert secret not in r.stdout
    root, dev, etc = (eval(part) for part in lines[7].replace("] [", "]|[").split("|"))  # noqa: S307 (own output)
    assert set(root) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp", "usr"}
    assert {"dev", "proc", "tmp", "usr"} <= set(root)
    assert dev == ["full", "null", "random", "urandom", "zero"]
    assert set(etc) <= {"alternatives", "ld.so.cache"}


def test_the_minimal_root_is_read_only_outside_the_work_directory():
    prog = (
        "import os\n"
        "for path in ('/x', '/usr/x', '/tmp/x', '/dev/x', '/proc/x', 'inside.txt'):\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        print('wrote', path)\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)\n"
        "print(open('/dev/urandom', 'rb').read(4) != b'', open('/dev/null', 'w').write('x'))\n"
    )
    r = run_python(prog, limits=FAST)
    assert r.verdict == "passed", r
    out = r.stdout.splitlines()
    assert all(line.startswith("refused") for line in out[:5]), out  # EROFS or EACCES, never written
    assert out[5:] == ["wrote inside.txt", "True 1"]


def test_a_user_without_namespaces_gets_the_weaker_mode_named_with_what_is_not_isolated():
    """A real unprivileged process probes: mode ``none``, logged, listing what is NOT isolated."""
    if os.geteuid() != 0:
        pytest.skip("starts the probe as another user")
    python = iso.isolation().python
    code = (  # these two modules alone: the package's __init__ files import what needs the venv
        "import sys, types\n"
        f"for name, path in (('jaxrl_mt', []), ('jaxrl_mt.tasks', [{os.path.dirname(iso.__file__)!r}])):\n"
        "    sys.modules[name] = types.ModuleType(name)\n"
        "    sys.modules[name].__path__ = path\n"
        "from jaxrl_mt.tasks import isolation as m\n"
        "found = m.isolation()\n"
        "print(found.mode)\n"
        "print(found.label)\n"
    )
    uid = iso.new_uid()
    r = subprocess.run(
        [python, "-I", "-c", code], user=uid, group=uid, extra_groups=[], cwd="/", env={"PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert r.returncode == 0, r.stderr
    mode, label = r.stdout.splitlines()
    assert mode == "none"
    assert label == (
        "rlimits-only (degraded): not running as root on Linux: no namespaces, no minimal root, no uid drop; "
        "NOT isolated: network, SysV IPC, host Unix sockets, the calling user's files, host processes and "
        "/proc/<parent> (environ, cmdline)"
    )
    assert r.stderr.strip() == f"sandbox isolation degraded: {label}"


def test_no_name_resolution_and_no_udp_out():
    prog = (
        "import socket\n"
        "try:\n"
        "    print(socket.getaddrinfo('example.com', 80))\n"
        "except socket.gaierror as e:\n"
        "    print('no dns', e.errno)\n"
        "for addr in (('8.8.8.8', 53), ('127.0.0.53', 53)):\n"
        "    try:\n"
        "        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', addr)\n"
        "        print('sent', addr)\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)\n"
    )
    r = run_python(prog, limits=FAST)
    assert r.verdict == "passed", r
    lines = r.stdout.splitlines()
    assert lines[0].startswith("no dns ") and lines[1:] == ["refused 101", "refused 101"], r.stdout  # ENETUNREACH
