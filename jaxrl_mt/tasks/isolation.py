"""How the sandbox walls a child process off: namespaces, a read-only view, a throwaway uid.

:mod:`jaxrl_mt.tasks.sandbox` runs model-written code; this module holds the operating-system
half. The strongest mode that works on the machine is found once per process by
:func:`isolation` (a probe that really starts a child) and used for every run:

``full`` (root, Linux namespaces; measured to work on the project's machines)
  The child, before ``exec``: ``unshare(CLONE_NEWNET | CLONE_NEWNS)`` (a network namespace with
  only a down loopback: no network at all, not even the host's 127.0.0.1), mount propagation made
  private, the whole mount tree remounted read-only with one recursive ``mount_setattr`` (per-mount
  remounts on kernels older than 5.12), a fresh size-limited tmpfs mounted on its work directory
  (its only writable place, gone with the namespace), resource limits, then all groups dropped and
  ``setgid``/``setuid`` to a random unused uid (no capabilities left, so nothing can be remounted;
  it cannot signal or read the environment of any other process; RLIMIT_NPROC counts only its own
  processes, and every process of that uid is killed after the run).
``uid`` (root, namespaces refused)
  The same limits and the throwaway uid, on a real temporary directory; network and world-writable
  directories (/tmp) stay reachable.
``none`` (not root)
  Resource limits, an empty environment and a temporary directory only; the child runs as the
  calling user, so it can still read that user's files and ``/proc/<parent>/environ``.

Anything weaker than ``full`` is logged once as a warning and named in every result
(:attr:`Isolation.label`). The interpreter for the child must be executable by the throwaway
uid: a Python under /root (e.g. pyenv) is not, so the first world-executable one among
``$JAXRL_SANDBOX_PYTHON``, ``sys.executable`` and the system ``python3`` is taken.
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

_CLONE_NEWNS, _CLONE_NEWNET = 0x00020000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 1
_UID_BASE, _UID_SPAN = 2_000_000, 1 << 20  # throwaway uids: no passwd entry, own no files


class _MountAttr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("attr_set", "attr_clr", "propagation", "userns_fd")]


try:  # loaded before any fork: the preexec hook only calls into it
    _LIBC = ctypes.CDLL(None, use_errno=True)
    _LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    _LIBC.syscall.restype = ctypes.c_long
except (OSError, AttributeError):  # pragma: no cover (not Linux/glibc)
    _LIBC = None


@dataclasses.dataclass(frozen=True)
class Isolation:
    """The isolation mode found on this machine.

    Attributes:
      mode: ``"full"``, ``"uid"`` or ``"none"`` (see the module doc).
      python: the interpreter the child runs.
      notice: why the mode is weaker than ``full`` ("" when it is full).
    """

    mode: str
    python: str
    notice: str = ""

    @property
    def label(self) -> str:
        """One line for results: the mode, plus the degradation notice when there is one."""
        what = {
            "full": "netns+ro-fs+tmpfs+uid",
            "uid": "uid-only (degraded)",
            "none": "rlimits-only (degraded)",
        }[self.mode]
        return f"{what}: {self.notice}" if self.notice else what


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the preexec hook does in one child.

    Attributes:
      mode: the isolation mode.
      workdir: the child's work directory (its cwd; in ``full`` mode a tmpfs is mounted there).
      uid: the throwaway uid (``uid``/``full`` modes), else None.
      rlimits: ``(resource, soft, hard)`` triples applied before the uid change.
      workdir_mb: tmpfs size (``full`` mode).
    """

    mode: str
    workdir: str
    uid: int | None
    rlimits: tuple[tuple[int, int, int], ...]
    workdir_mb: int = 64


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


def _enter_namespaces(workdir: str, uid: int, size_mb: int) -> None:
    """New net + mount namespaces, read-only tree, a private tmpfs on ``workdir`` (as cwd)."""
    _check(_LIBC.unshare(_CLONE_NEWNET | _CLONE_NEWNS), "unshare(CLONE_NEWNET|CLONE_NEWNS)")
    _check(_LIBC.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
    attr = _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0)
    ret = _LIBC.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, b"/", _AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr))
    if ret != 0:
        _remount_each_read_only()
    opts = f"size={size_mb}m,nr_inodes=4096,mode=0700,uid={uid},gid={uid}".encode()
    _check(_LIBC.mount(b"tmpfs", workdir.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts), "mount tmpfs")
    os.chdir(workdir)


def make_preexec(plan: Plan):
    """The function ``subprocess`` runs in the child between ``fork`` and ``exec``.

    Runs after ``setsid`` (``start_new_session=True``); the order matters: namespaces and mounts
    need root, hard limits are lowered while still root, the uid change comes last.

    ``preexec_fn`` is documented as unsafe in a threaded parent because the child could block on
    a lock another thread held at ``fork``. This hook takes none: it imports nothing, does not
    log, and makes only system calls (ctypes ``unshare``/``mount``/``mount_setattr``, ``chdir``,
    ``setrlimit``, ``setgroups``/``setgid``/``setuid``; ``open`` of /proc/self/mountinfo only on
    kernels without ``mount_setattr``).
    """
    import resource

    def preexec() -> None:
        if plan.mode == "full":
            _enter_namespaces(plan.workdir, plan.uid, plan.workdir_mb)
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


def _try_mode(mode: str, python: str) -> str:
    """Starts ``python`` under ``mode`` on a trivial program; "" when it worked, else why not."""
    import resource

    uid = new_uid()
    workdir = tempfile.mkdtemp(prefix="jaxrl_sandbox_probe_")
    try:
        if mode == "uid":
            os.chown(workdir, uid, uid)
        plan = Plan(mode, workdir, uid, ((resource.RLIMIT_CORE, 0, 0),), 8)
        code = ("import os, socket\ns = socket.socket()\ntry:\n    s.connect(('127.0.0.1', 9))\n"
                "except OSError as e:\n    print(e.errno)\nprint(os.getuid())")
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
        if r.returncode != 0 or r.stdout.split()[-1:] != [str(uid).encode()]:
            return (
                f"{mode} mode: probe child failed (status {r.returncode}: {r.stderr.decode(errors='replace')[-200:]})"
            )
        return ""
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _why_full_fails() -> str:
    """Runs the namespace setup in a forked child to learn why it fails ("" if it does not)."""
    workdir = tempfile.mkdtemp(prefix="jaxrl_sandbox_probe_")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (child)
        try:
            os.close(r)
            _enter_namespaces(workdir, new_uid(), 8)
            os.write(w, b"")
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
        return Isolation("none", sys.executable, f"{why}: no network namespace, no read-only filesystem, no uid drop")
    pythons = [p for p in _python_candidates() if _world_executable(p)]
    if not pythons:
        return Isolation(
            "none", sys.executable, "no Python interpreter executable by an unprivileged uid; set $JAXRL_SANDBOX_PYTHON"
        )
    notes = []
    for python in pythons:
        why = _try_mode("full", python)
        if not why:
            return Isolation("full", python)
        notes.append(why)
    detail = _why_full_fails() or "; ".join(notes)
    for python in pythons:
        if not _try_mode("uid", python):
            return Isolation("uid", python, f"namespaces refused ({detail}): network and /tmp reachable")
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
