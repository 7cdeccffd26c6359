"""How the sandbox walls a child process off: namespaces, a minimal read-only root, a throwaway uid.

:mod:`jaxrl_mt.tasks.sandbox` runs model-written code; this module holds the operating-system
half. The strongest mode that works on the machine is found once per process by
:func:`isolation` (a probe that really starts a child) and used for every run:

``full`` (root, Linux namespaces; measured to work on the project's machines)
  The child, before ``exec``: ``unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID)`` (a network
  namespace with only a down loopback: no network at all, not even the host's 127.0.0.1, and no
  host abstract Unix sockets), mount propagation made private, the whole mount tree remounted
  read-only with one recursive ``mount_setattr`` (per-mount remounts on kernels older than 5.12),
  then a ``fork``: the forked process is PID 1 of the new PID namespace and runs the program; the
  first one only relays its exit status. PID 1 builds a minimal root on a small tmpfs: read-only
  binds of the system directories the interpreter needs (``/usr``, ``/lib*``, ``/bin``,
  ``/etc/ld.so.cache``, the interpreter's own prefix when it lies elsewhere; see
  :attr:`Isolation.ro_paths`), five device nodes (``/dev/null``, ``zero``, ``full``, ``random``,
  ``urandom``), a fresh ``/proc`` of the new PID namespace, and a fresh size-limited tmpfs at the
  work directory's path (its only writable place). It moves in with ``pivot_root`` and detaches
  the host tree, so no host file, host ``/tmp``, host Unix-domain socket or other process is there to
  reach: ``/proc`` lists the run's own processes only. Then resource limits, all groups dropped
  and ``setgid``/``setuid`` to a random unused uid (no capabilities left, so nothing can be
  remounted; RLIMIT_NPROC counts only its own processes). When the program (PID 1) ends, the
  kernel kills everything left in its PID namespace; every process of the uid is also killed.
``uid`` (root, namespaces refused)
  The same limits and the throwaway uid, on a real temporary directory. NOT isolated: network,
  host Unix sockets, world-writable directories (/tmp), world-readable files, the process list.
``none`` (not root)
  Resource limits, an empty environment and a temporary directory only. NOT isolated: network,
  host Unix sockets, every file of the calling user, the process list and ``/proc/<parent>``.

Anything weaker than ``full`` is logged once as a warning and named in every result, with what is
not isolated (:attr:`Isolation.label`). The interpreter for the child must be executable by the
throwaway uid: a Python under /root (e.g. pyenv) is not, so the first world-executable one among
``$JAXRL_SANDBOX_PYTHON``, ``sys.executable`` and the system ``python3`` is taken.

PID 1 of a namespace receives only the signals it has a handler for from processes inside it
(``os.kill(os.getpid(), SIGTERM)`` does nothing), and ``os.getppid()`` is 0 there.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

log = logging.getLogger(__name__)

__all__ = ["Isolation", "Plan", "isolation", "kill_uid", "make_preexec", "new_uid"]

_CLONE_NEWNS, _CLONE_NEWPID, _CLONE_NEWNET = 0x00020000, 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MNT_DETACH = 1, 2, 4, 8, 2
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 1
_UID_BASE, _UID_SPAN = 2_000_000, 1 << 20  # throwaway uids: no passwd entry, own no files
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41}.get(os.uname().machine)
# What the minimal root shows of the host (read-only; missing ones are skipped); symlinks are copied.
_SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache", "/etc/alternatives")
_DEVICES = ("null", "zero", "full", "random", "urandom")
_NOT_ISOLATED = {
    "full": "",
    "uid": "network, host Unix sockets, world-writable dirs (/tmp), world-readable host files, host processes (/proc)",
    "none": "network, host Unix sockets, the calling user's files, host processes and /proc/<parent> (environ, cmdline)",
}


class _MountAttr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("attr_set", "attr_clr", "propagation", "userns_fd")]


try:  # loaded before any fork: the preexec hook only calls into it
    _LIBC = ctypes.CDLL(None, use_errno=True)
    _LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    _LIBC.syscall.restype = ctypes.c_long
    _LIBC.signal.argtypes, _LIBC.signal.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p
    _FORK = ctypes.PyDLL(None, use_errno=True).fork  # PyDLL: the GIL stays held across the fork
except (OSError, AttributeError):  # pragma: no cover (not Linux/glibc)
    _LIBC = _FORK = None


@dataclasses.dataclass(frozen=True)
class Isolation:
    """The isolation mode found on this machine.

    Attributes:
      mode: ``"full"``, ``"uid"`` or ``"none"`` (see the module doc).
      python: the interpreter the child runs.
      notice: why the mode is weaker than ``full`` ("" when it is full).
      ro_paths: the host paths the minimal root shows read-only (``full`` mode).
    """

    mode: str
    python: str
    notice: str = ""
    ro_paths: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """One line for results: what is isolated; when degraded, why and what is NOT isolated."""
        what = {
            "full": "netns+pidns+min-ro-root+tmpfs+uid",
            "uid": "uid-only (degraded)",
            "none": "rlimits-only (degraded)",
        }[self.mode]
        if self.mode == "full":
            return f"{what}: {self.notice}" if self.notice else what
        return f"{what}: {self.notice}; NOT isolated: {_NOT_ISOLATED[self.mode]}"


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the preexec hook does in one child.

    Attributes:
      mode: the isolation mode.
      workdir: the child's work directory (its cwd; in ``full`` mode a tmpfs is mounted there).
      uid: the throwaway uid (``uid``/``full`` modes), else None.
      rlimits: ``(resource, soft, hard)`` triples applied before the uid change.
      workdir_mb: tmpfs size (``full`` mode).
      ro_paths: host paths bound read-only into the minimal root (``full`` mode).
    """

    mode: str
    workdir: str
    uid: int | None
    rlimits: tuple[tuple[int, int, int], ...]
    workdir_mb: int = 64
    ro_paths: tuple[str, ...] = _SYSTEM_PATHS


def new_uid() -> int:
    """A random uid from a range no account uses (one per run)."""
    return _UID_BASE + secrets.randbelow(_UID_SPAN)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _remount_each_read_only() -> None:
    """Fallback for kernels without ``mount_setattr``: remount every mount point read-only."""
    flag_of = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC}
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        rows = [line.split() for line in f]
    for row in reversed(rows):
        point, opts = row[4].encode(), row[5].split(",")
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
        flags |= sum(flag_of.get(o, 0) for o in opts)
        _check(_LIBC.mount(None, point, None, flags, None), f"remount {row[4]} read-only")


def _enter_namespaces() -> None:
    """New net + mount + PID namespaces (the PID one for the next child), the host tree read-only."""
    _check(_LIBC.unshare(_CLONE_NEWNET | _CLONE_NEWNS | _CLONE_NEWPID), "unshare(NEWNET|NEWNS|NEWPID)")
    _check(_LIBC.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
    attr = _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0)
    ret = _LIBC.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, b"/", _AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr))
    if ret != 0:
        _remount_each_read_only()


def _mkdirs(path: str) -> None:
    if not os.path.isdir(path):
        _mkdirs(os.path.dirname(path))
        os.mkdir(path, 0o755)


def _bind(src: str, dst: str) -> None:
    """``src`` shown at ``dst`` (a symlink is copied; mounts inherit the host tree's read-only flag)."""
    _mkdirs(os.path.dirname(dst))
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    if os.path.isdir(src):
        os.mkdir(dst, 0o755)
    else:
        os.close(os.open(dst, os.O_CREAT | os.O_WRONLY, 0o644))
    _check(_LIBC.mount(src.encode(), dst.encode(), None, _MS_BIND | _MS_REC, None), f"bind {src}")


def _enter_minimal_root(plan: Plan) -> None:
    """As PID 1 of the new namespace: pivots into a tmpfs root holding only ``plan.ro_paths``,
    device nodes, a fresh /proc and the work tmpfs; cwd is the work directory."""
    root = plan.workdir  # a host directory nothing else uses: the new root is mounted over it
    _check(_LIBC.mount(b"tmpfs", root.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=1m,mode=0755"), "root tmpfs")
    for path in plan.ro_paths:
        if os.path.lexists(path):
            _bind(path, root + path)
    for dev in _DEVICES:
        _bind(f"/dev/{dev}", f"{root}/dev/{dev}")
    os.mkdir(f"{root}/proc", 0o555)
    _check(_LIBC.mount(b"proc", f"{root}/proc".encode(), b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None), "proc")
    work = root + plan.workdir
    _mkdirs(work)
    opts = f"size={plan.workdir_mb}m,nr_inodes=4096,mode=0700,uid={plan.uid},gid={plan.uid}".encode()
    _check(_LIBC.mount(b"tmpfs", work.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts), "work tmpfs")
    os.mkdir(f"{root}/.old", 0o700)
    if _SYS_PIVOT_ROOT is not None:
        _check(_LIBC.syscall(_SYS_PIVOT_ROOT, root.encode(), f"{root}/.old".encode()), "pivot_root")
        os.chdir("/")
        _check(_LIBC.umount2(b"/.old", _MNT_DETACH), "detach the host tree")
    else:  # pragma: no cover (no pivot_root number known for this machine)
        os.chroot(root)
    os.rmdir("/.old")
    _check(_LIBC.mount(None, b"/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None), "root read-only")
    os.chdir(plan.workdir)


def _relay(pid: int) -> None:
    """The forked-from process: holds no fd (so pipes and ``Popen``'s exec check see only PID 1),
    waits for PID 1 and leaves with its status (the same signal when it was killed)."""
    os.closerange(0, 1 << 16)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:  # pragma: no cover
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        _LIBC.signal(sig, None)  # SIG_DFL (the parent's handlers were inherited)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def make_preexec(plan: Plan):
    """The function ``subprocess`` runs in the child between ``fork`` and ``exec``.

    Runs after ``setsid`` (``start_new_session=True``); the order matters: namespaces and mounts
    need root, hard limits are lowered while still root, the uid change comes last. In ``full``
    mode it forks once (into the new PID namespace); the original process only relays the status.

    ``preexec_fn`` is documented as unsafe in a threaded parent because the child could block on
    a lock another thread held at ``fork``. This hook takes none: it imports nothing, does not
    log, and makes only system calls (ctypes ``unshare``/``mount``/``mount_setattr``/``fork``/
    ``pivot_root``, ``mkdir``/``symlink``/``open`` in its own tmpfs, ``chdir``, ``setrlimit``,
    ``setgroups``/``setgid``/``setuid``; ``open`` of /proc/self/mountinfo only on kernels without
    ``mount_setattr``).
    """
    import resource

    def preexec() -> None:
        if plan.mode == "full":
            _enter_namespaces()
            pid = _FORK()
            if pid < 0:
                raise OSError(ctypes.get_errno(), "fork into the PID namespace")
            if pid > 0:
                _relay(pid)
            _enter_minimal_root(plan)
        for res, soft, hard in plan.rlimits:
            resource.setrlimit(res, (soft, hard))
        if plan.uid is not None:
            os.setgroups([])
            os.setgid(plan.uid)
            os.setuid(plan.uid)

    return preexec


def kill_uid(uid: int, rounds: int = 50) -> int:
    """SIGKILLs every process whose real uid is ``uid`` until none is left; returns how many pids.

    Catches what a process-group kill misses (a grandchild that called ``setsid``). Only for the
    throwaway uids of :func:`new_uid`: no other process runs under them.
    """
    killed: set[int] = set()
    for _ in range(rounds):
        found = 0
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                if os.stat(f"/proc/{pid}").st_uid != uid:  # cheap pre-filter (owner = effective uid)
                    continue
                with open(f"/proc/{pid}/status", encoding="utf-8") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
                if fields["State"].split()[0] not in ("Z", "X") and int(fields["Uid"].split()[0]) == uid:
                    os.kill(int(pid), signal.SIGKILL)
                    killed.add(int(pid))
                    found += 1
            except (OSError, KeyError, ValueError, IndexError):
                continue
        if not found:
            break
        time.sleep(0.002)  # let the kills land before looking again
    return len(killed)


def _world_executable(path: str) -> bool:
    """Whether a user with no groups could execute ``path`` (every directory on the way searchable)."""
    for p in {os.path.abspath(path), os.path.realpath(path)}:
        try:
            if not os.stat(p).st_mode & stat.S_IXOTH:
                return False
            d = os.path.dirname(p)
            while True:
                if not os.stat(d).st_mode & stat.S_IXOTH:
                    return False
                if d == os.path.dirname(d):
                    break
                d = os.path.dirname(d)
        except OSError:
            return False
    return True


def _python_candidates() -> list[str]:
    out = [os.environ.get("JAXRL_SANDBOX_PYTHON", ""), sys.executable, getattr(sys, "_base_executable", "")]
    out += ["/usr/bin/python3", "/usr/local/bin/python3"]
    return [p for i, p in enumerate(out) if p and p not in out[:i] and os.path.exists(p)]


def _ro_paths(python: str) -> tuple[str, ...]:
    """The system paths, plus where ``python`` and its standard library live when that is elsewhere."""
    r = subprocess.run(
        [python, "-I", "-c", "import sys; print(sys.base_prefix); print(sys.base_exec_prefix)"],
        capture_output=True, text=True, timeout=20, check=False,
    )
    out = list(_SYSTEM_PATHS)
    for p in [os.path.dirname(os.path.abspath(python)), os.path.dirname(os.path.realpath(python)), *r.stdout.split()]:
        if p not in ("", "/") and not any(p == q or p.startswith(q + "/") for q in out):
            out.append(p)
    return tuple(out)


def _probe_plan(mode: str, python: str, workdir: str, uid: int) -> Plan:
    import resource

    return Plan(mode, workdir, uid, ((resource.RLIMIT_CORE, 0, 0),), 8, _ro_paths(python))


def _try_mode(mode: str, python: str) -> str:
    """Starts ``python`` under ``mode`` on a trivial program; "" when it worked, else why not."""
    uid = new_uid()
    workdir = tempfile.mkdtemp(prefix="jaxrl_sandbox_probe_")
    try:
        if mode == "uid":
            os.chown(workdir, uid, uid)
        plan = _probe_plan(mode, python, workdir, uid)
        code = ("import os, socket\ns = socket.socket()\ntry:\n    s.connect(('127.0.0.1', 9))\n"
                "except OSError as e:\n    print(e.errno)\nprint(os.getpid() if os.getpid() == 1 else 'pid?', os.getuid())")
        try:
            r = subprocess.run(
                [python, "-I", "-B", "-c", code],
                cwd=workdir,
                env={"PATH": "/usr/bin:/bin"},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=20,
                preexec_fn=make_preexec(plan),
                start_new_session=True,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as e:
            return f"{mode} mode: the child did not start ({e})"
        finally:
            kill_uid(uid)
        want = [b"1", str(uid).encode()] if mode == "full" else [str(uid).encode()]
        if r.returncode != 0 or r.stdout.split()[-len(want):] != want:
            return (
                f"{mode} mode: probe child failed (status {r.returncode}: {r.stderr.decode(errors='replace')[-200:]})"
            )
        return ""
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _why_full_fails(python: str) -> str:
    """Runs the namespace and root setup in a forked child to learn why it fails ("" if it does not)."""
    workdir = tempfile.mkdtemp(prefix="jaxrl_sandbox_probe_")
    plan = _probe_plan("full", python, workdir, new_uid())
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (child)
        try:
            os.close(r)
            _enter_namespaces()
            child = _FORK()
            if child > 0:
                os.close(w)
                os._exit(os.waitpid(child, 0)[1] >> 8)
            _enter_minimal_root(plan)
            os._exit(0)
        except BaseException as e:  # noqa: BLE001 (reported to the parent)
            os.write(w, str(e).encode()[:500])
            os._exit(1)
    os.close(w)
    msg = os.read(r, 600).decode(errors="replace")
    os.close(r)
    os.waitpid(pid, 0)
    shutil.rmtree(workdir, ignore_errors=True)
    return msg


_LOCK = threading.Lock()
_FOUND: Isolation | None = None


def _find() -> Isolation:
    if os.geteuid() != 0 or _LIBC is None or not sys.platform.startswith("linux"):
        why = "not running as root on Linux" if os.geteuid() != 0 else "no libc/Linux"
        return Isolation("none", sys.executable, f"{why}: no namespaces, no minimal root, no uid drop")
    pythons = [p for p in _python_candidates() if _world_executable(p)]
    if not pythons:
        return Isolation(
            "none", sys.executable, "no Python interpreter executable by an unprivileged uid; set $JAXRL_SANDBOX_PYTHON"
        )
    notes = []
    for python in pythons:
        why = _try_mode("full", python)
        if not why:
            return Isolation("full", python, ro_paths=_ro_paths(python))
        notes.append(why)
    detail = _why_full_fails(pythons[0]) or "; ".join(notes)
    for python in pythons:
        if not _try_mode("uid", python):
            return Isolation("uid", python, f"namespaces refused ({detail})")
    return Isolation("none", sys.executable, f"namespaces and uid drop refused ({detail})")


def isolation() -> Isolation:
    """The isolation mode of this machine (probed once per process; a warning when degraded)."""
    global _FOUND
    with _LOCK:
        if _FOUND is None:
            _FOUND = _find()
            if _FOUND.mode != "full":
                log.warning("sandbox isolation degraded: %s", _FOUND.label)
        return _FOUND
