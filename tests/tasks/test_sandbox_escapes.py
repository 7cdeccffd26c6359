"""Issue 53, failure 1: the sandbox's escapes of the second probe, each with the probe's input.

Before: sandboxed code made SysV shared memory, a semaphore set and a message queue that outlived
the run on the host (and listed the host's), four forked children touching memory each got the
whole per-process limit (4 x 100 MB under a 256 MB limit), every bind was ``suid``/``dev``,
``NoNewPrivs`` was 0 and the host name was the host's. Every test runs real sandboxed programs.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import secrets
import socket
import subprocess

import pytest

from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.tasks import CodeTask, memcap
from jaxrl_mt.tasks import isolation as iso
from jaxrl_mt.tasks.sandbox import SandboxLimits, run_python

FAST = SandboxLimits(timeout_s=5.0)
_IPC_CREAT, _IPC_RMID = 0o1000, 0

# The probe's reply: 100 MB of SysV shared memory (touched), a semaphore set, a message queue,
# then what it sees of the host's objects.
IPC_PROGRAM = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shm = libc.shmget(0, 100 << 20, 0o1000 | 0o600)
addr = libc.shmat(shm, None, 0)
if shm >= 0 and addr != ctypes.c_void_p(-1).value:
    ctypes.memset(addr, 1, 100 << 20)
made = [shm, libc.semget(0, 4, 0o1000 | 0o600), libc.msgget(0, 0o1000 | 0o600)]
assert min(made) >= 0, made
seen = {n: len(open("/proc/sysvipc/" + n).read().splitlines()) - 1 for n in ("shm", "sem", "msg")}
print("seen", seen["shm"], seen["sem"], seen["msg"])
print("host key", libc.shmget(HOST_KEY, 0, 0), ctypes.get_errno())
"""


def _full_only() -> None:
    if iso.isolation().mode != "full":
        pytest.skip(f"sandbox isolation here is {iso.isolation().label!r}; this needs mode full")


def _ipcs() -> str:
    return subprocess.run(["ipcs"], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def host_segment():
    """A SysV shared-memory segment of the host's (random key), removed afterwards."""
    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x53000000 + secrets.randbelow(1 << 20)
    shm = libc.shmget(key, 4096, _IPC_CREAT | 0o644)
    assert shm >= 0, os.strerror(ctypes.get_errno())
    yield key
    libc.shmctl(shm, _IPC_RMID, None)


def test_sysv_ipc_objects_die_with_the_run_and_the_hosts_are_invisible(host_segment):
    _full_only()
    before = _ipcs()
    r = run_python(IPC_PROGRAM.replace("HOST_KEY", str(host_segment)), limits=FAST)
    assert r.verdict == "passed", r
    assert _ipcs() == before  # before: 3 objects (100 MB of shared memory) left on the host
    seen, host = r.stdout.splitlines()
    assert seen == "seen 1 1 1"  # its own objects only (before: the host's too)
    assert host == "host key -1 2"  # the host's segment: ENOENT in its IPC namespace


def test_lic_code_task_end_to_end_with_the_ipc_reply(host_segment):
    _full_only()
    task = load_source("humaneval:@:1")[0]
    code = IPC_PROGRAM.replace("HOST_KEY", str(host_segment)) + "\n" + task.answer
    before = _ipcs()
    verdict = CodeTask(limits=FAST).verify(f"```python\n{code}\n```", task)
    assert (verdict.score, verdict.status) == (1.0, "passed"), verdict
    assert _ipcs() == before


FORK_AND_TOUCH = r"""
import os, time
pids = []
for i in range(4):
    try:
        pid = os.fork()
    except OSError as e:
        print("fork refused", e.errno)
        continue
    if pid == 0:
        try:
            b = bytearray(100 << 20)
            b[::4096] = b"\1" * len(range(0, len(b), 4096))
            time.sleep(0.5)
            os._exit(0)
        except MemoryError:
            os._exit(3)
    pids.append(pid)
print("touched", sum(os.waitpid(p, 0)[1] == 0 for p in pids))
"""


@pytest.mark.parametrize("kind", ["cgroup", "cgroup, uid mode", "rlimit"])
def test_fork_and_touch_is_stopped_at_the_configured_total(kind, monkeypatch):
    """4 children x 100 MB under a 256 MB limit: at most 2 can hold theirs (before: all 4, 400 MB).
    In ``uid`` mode the bootstrap waits on the gate; in ``full`` mode the child's init does."""
    if kind.startswith("cgroup") and memcap.memory_bound().kind == "rlimit":
        pytest.skip(f"no cgroup on this host: {memcap.memory_bound().notice}")
    if kind == "rlimit":
        monkeypatch.setattr(memcap, "_FOUND", memcap.MemoryBound("rlimit", notice="forced by the test"))
    if kind.endswith("uid mode"):
        if iso.isolation().mode not in ("full", "uid"):
            pytest.skip(f"sandbox isolation here is {iso.isolation().label!r}; this needs a throwaway uid")
        monkeypatch.setattr(iso, "_FOUND", dataclasses.replace(iso.isolation(), mode="uid"))
    if iso.isolation().mode == "none" and os.geteuid() == 0:
        pytest.skip("as root without a throwaway uid RLIMIT_NPROC does not bind")
    r = run_python(FORK_AND_TOUCH, limits=SandboxLimits(timeout_s=5.0, memory_mb=256))
    assert r.memory.startswith("cgroup" if kind.startswith("cgroup") else "rlimit: 1 processes x 256 MiB"), r.memory
    touched = [int(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("touched")]
    if r.verdict == "crashed":  # the OOM killer may pick the parent too
        assert "SIGKILL" in r.reason and not touched, r
    else:
        assert r.verdict == "passed" and touched and touched[0] * 100 <= 256, r


def test_the_rlimit_split_keeps_the_product_under_the_limit():
    for memory_mb, procs in ((1024, 16), (256, 16), (100, 16), (4096, 8), (1024, 1)):
        n, each = memcap.split(memory_mb, procs)
        assert 1 <= n <= procs and n * each <= memory_mb and (each >= memcap.MIN_PROCESS_MB or n == 1)
    assert memcap.split(1024, 16) == (4, 256)


def test_the_runs_cgroup_is_removed():
    bound = memcap.memory_bound()
    if bound.kind == "rlimit":
        pytest.skip(f"no cgroup on this host: {bound.notice}")
    mine = f"jaxrl_sbx_{os.getpid()}_"
    r = run_python("import os\nos.fork() or print('child')", limits=FAST)
    assert r.verdict == "passed" and r.memory == f"{bound.kind}: {FAST.memory_mb} MiB for the whole run"
    assert [n for n in os.listdir(bound.base) if n.startswith(mine)] == []


def test_mounts_are_nosuid_and_nodev_and_no_new_privileges():
    _full_only()
    prog = (
        "for line in open('/proc/self/mountinfo'):\n"
        "    f = line.split()\n"
        "    print(f[4], f[5])\n"
        "print('nnp', [l.split()[1] for l in open('/proc/self/status') if l.startswith('NoNewPrivs')][0])\n"
    )
    r = run_python(prog, limits=FAST)
    assert r.verdict == "passed", r
    *mounts, nnp = r.stdout.splitlines()
    assert nnp == "nnp 1"  # before: 0
    flags = {m.split()[0]: m.split()[1].split(",") for m in mounts}
    assert "/usr" in flags and all("nosuid" in f for f in flags.values()), flags  # before: /usr ro,relatime
    assert all("nodev" in f for p, f in flags.items() if not p.startswith("/dev/")), flags
    assert "nodev" not in flags["/dev/null"]  # the device nodes still work
    assert "NoNewPrivs:\t1" not in open("/proc/self/status").read()  # only the child's flag


def test_own_host_name():
    _full_only()
    prog = (
        "import socket\nprint(socket.gethostname())\n"
        "try:\n    socket.sethostname('evil')\nexcept OSError as e:\n    print('refused', e.errno)\n"
    )
    r = run_python(prog, limits=FAST)
    assert r.stdout.splitlines() == ["sandbox", "refused 1"], r  # before: the host's name
    assert socket.gethostname() != "evil"


def test_the_remount_fallback_for_kernels_without_mount_setattr_sets_the_same_flags():
    """The per-mount remounts (kernels before 5.12) leave every mount read-only and nosuid, and the
    system paths' binds nodev too: run in a forked child in its own mount namespace."""
    _full_only()
    from jaxrl_mt.tasks import sandbox_init as si

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (child)
        try:
            os.close(r)
            si._check(si._LIBC.unshare(si._CLONE_NEWNS), "unshare")
            si._mount(None, "/", None, si._MS_REC | si._MS_PRIVATE, None, "private")
            si._remount_each("/", si._MS_NOSUID)
            si._remount_each("/usr", si._MS_NOSUID | si._MS_NODEV)
            with open("/proc/self/mountinfo", encoding="utf-8") as f:
                os.write(w, f.read().encode())
            os._exit(0)
        except BaseException as e:  # noqa: BLE001
            os.write(w, f"error {e}".encode())
            os._exit(1)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    assert os.waitpid(pid, 0)[1] == 0, out
    top = {row[4]: row for row in (line.split() for line in out.splitlines())}  # over-mounted ones are hidden
    rows = list(top.values())
    assert rows and all("ro" in row[5].split(",") and "nosuid" in row[5].split(",") for row in rows), out
    assert all("nodev" in row[5].split(",") for row in rows if row[4] == "/usr" or row[4].startswith("/usr/"))
    with open("/proc/self/mountinfo", encoding="utf-8") as f:  # the host's mounts are untouched
        assert any("rw" in line.split()[5].split(",") for line in f)


def test_without_a_writable_cgroup_the_rlimit_split_applies_and_says_why(monkeypatch):
    monkeypatch.setenv("JAXRL_SANDBOX_CGROUP", "off")
    assert memcap._find() == memcap.MemoryBound("rlimit", notice="cgroups turned off by $JAXRL_SANDBOX_CGROUP")
    if os.geteuid() != 0:
        return
    code = (  # a real unprivileged process, memcap alone (the package's __init__ files need the venv)
        "import importlib.util, logging, sys\n"
        "logging.basicConfig(format='%(message)s')\n"
        f"spec = importlib.util.spec_from_file_location('memcap', {memcap.__file__!r})\n"
        "m = sys.modules['memcap'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(m)\n"
        "print(m.memory_bound())\n"
    )
    uid = iso.new_uid()
    r = subprocess.run([iso.isolation().python, "-I", "-c", code], user=uid, group=uid, extra_groups=[], cwd="/",
                       env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30, check=False)
    assert r.stdout.strip() == "MemoryBound(kind='rlimit', base='', notice='not root: no cgroup is writable')", r
    assert r.stderr.strip() == (
        "sandbox memory bound: no cgroup (not root: no cgroup is writable); each run gets RLIMIT_AS x RLIMIT_NPROC "
        "within its memory limit"
    )
