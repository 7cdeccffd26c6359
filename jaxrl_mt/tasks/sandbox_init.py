"""The namespace half of the sandbox's ``full`` mode, as it runs inside the child.

Two places run this code. The parent's ``preexec`` hook (:func:`jaxrl_mt.tasks.isolation.make_preexec`)
calls :func:`enter_namespaces` between ``fork`` and ``exec``. Then the child's own fresh
interpreter, still root, executes this module's source (passed on its command line, before the
sandbox bootstrap) and calls :func:`enter`: it waits until the parent has moved it into the run's
memory cgroup (:func:`wait_gate`), then forks once more, now cheaply (a fresh interpreter, not a
copy of a large parent), into the new PID namespace; the forked process is PID 1 there, builds
the minimal root (every mount ``nosuid``, the system binds ``nodev``), lowers its limits, drops to
the throwaway uid with ``PR_SET_NO_NEW_PRIVS`` and returns to run the program, while the first
one only relays PID 1's exit status.

Only ``os``, ``ctypes`` and ``resource`` are imported: the child has nothing else yet.
"""

from __future__ import annotations

import ctypes
import os
import resource

_CLONE_NEWNS, _CLONE_NEWPID, _CLONE_NEWNET = 0x00020000, 0x20000000, 0x40000000
_CLONE_NEWIPC, _CLONE_NEWUTS = 0x08000000, 0x04000000
_NAMESPACES = _CLONE_NEWNET | _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MNT_DETACH = 1, 2, 4, 8, 2
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE = 442, -100, 0x8000
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 1, 2, 4
_BIND_ATTRS = _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV  # the system paths' binds
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41}.get(os.uname().machine)
_PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS = 4, 38
HOSTNAME = b"sandbox"  # the UTS namespace's host name (the host's own name is not shown)
DEVICES = ("null", "zero", "full", "random", "urandom")
SETUP_FAILED = 125  # PID 1's exit status when the root could not be built (the reason is on stderr)


class _MountAttr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("attr_set", "attr_clr", "propagation", "userns_fd")]


try:  # loaded before any fork: the preexec hook only calls into it
    _LIBC = ctypes.CDLL(None, use_errno=True)
    _LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    _LIBC.syscall.restype = ctypes.c_long
except (OSError, AttributeError):  # pragma: no cover (not Linux/glibc)
    _LIBC = None


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, opts: str | None, what: str) -> None:
    enc = [None if x is None else x.encode() for x in (src, dst, fstype, opts)]
    _check(_LIBC.mount(enc[0], enc[1], enc[2], flags, enc[3]), what)


def _remount_each(path: str, extra: int) -> None:
    """Fallback for kernels without ``mount_setattr``: remounts every mount point at or under
    ``path`` read-only, with the flags ``extra`` added to the ones it has."""
    flag_of = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC}
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        rows = [line.split() for line in f]
    for row in reversed(rows):
        if path != "/" and row[4] != path and not row[4].startswith(path + "/"):
            continue
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | extra | sum(flag_of.get(o, 0) for o in row[5].split(","))
        _mount(None, row[4], None, flags, None, f"remount {row[4]} read-only")


def _set_attrs(path: str, attrs: int, fallback_flags: int) -> None:
    """Sets ``attrs`` (``MOUNT_ATTR_*``) on the mount tree at ``path``, recursively."""
    attr = _MountAttr(attrs, 0, 0, 0)
    ret = _LIBC.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, path.encode(), _AT_RECURSIVE, ctypes.byref(attr),
                        ctypes.sizeof(attr))
    if ret != 0:
        _remount_each(path, fallback_flags)


def enter_namespaces() -> None:
    """New net, mount, IPC and UTS namespaces and a PID one (for the next child); the host tree
    private, read-only and ``nosuid`` (``nodev`` is added per bind: the device nodes need it off).

    The IPC namespace holds every SysV object and POSIX message queue the program makes; the
    kernel destroys them with the namespace when the run's last process is gone.
    """
    _check(_LIBC.unshare(_NAMESPACES), "unshare(NEWNET|NEWNS|NEWPID|NEWIPC|NEWUTS)")
    if _NAMESPACES & _CLONE_NEWUTS:  # never the host's name
        _check(_LIBC.sethostname(HOSTNAME, len(HOSTNAME)), "sethostname")
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE, None, "make / private")
    _set_attrs("/", _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID, _MS_NOSUID)


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
        _mkdirs(dst)
    else:
        os.close(os.open(dst, os.O_CREAT | os.O_WRONLY, 0o644))
    _mount(src, dst, None, _MS_BIND | _MS_REC, None, f"bind {src}")


def enter_minimal_root(workdir: str, uid: int, workdir_mb: int, ro_paths: tuple[str, ...]) -> None:
    """As PID 1: pivots into a tmpfs root holding only ``ro_paths``, device nodes, a fresh /proc
    and a fresh tmpfs at ``workdir``'s path (the cwd afterwards); the host tree is detached."""
    root = workdir  # a host directory nothing else uses: the new root is mounted over it
    _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=0755", "root tmpfs")
    for path in ro_paths:
        if os.path.lexists(path):
            _bind(path, root + path)
            if not os.path.islink(path):
                _set_attrs(root + path, _BIND_ATTRS, _MS_NOSUID | _MS_NODEV)
    for dev in DEVICES:
        _bind(f"/dev/{dev}", f"{root}/dev/{dev}")
    os.mkdir(f"{root}/proc", 0o555)
    _mount("proc", f"{root}/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None, "mount /proc")
    _mkdirs(root + workdir)
    opts = f"size={workdir_mb}m,nr_inodes=4096,mode=0700,uid={uid},gid={uid}"
    _mount("tmpfs", root + workdir, "tmpfs", _MS_NOSUID | _MS_NODEV, opts, "work tmpfs")
    os.mkdir(f"{root}/.old", 0o700)
    if _SYS_PIVOT_ROOT is not None:
        _check(_LIBC.syscall(_SYS_PIVOT_ROOT, root.encode(), f"{root}/.old".encode()), "pivot_root")
        os.chdir("/")
        _check(_LIBC.umount2(b"/.old", _MNT_DETACH), "detach the host tree")
    else:  # pragma: no cover (no pivot_root number known for this machine)
        os.chroot(root)
    os.rmdir("/.old")
    _mount(None, "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None, "root read-only")
    os.chdir(workdir)


def drop(rlimits: tuple[tuple[int, int, int], ...], uid: int | None) -> None:
    """Lowers the resource limits (while still root), then all groups and the uid; sets
    ``PR_SET_NO_NEW_PRIVS`` (no later ``exec`` gains privileges: setuid bits, file capabilities)."""
    for res, soft, hard in rlimits:
        resource.setrlimit(res, (soft, hard))
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        _LIBC.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)  # as after an exec: its /proc/self files are its own
    if _LIBC is not None:
        _check(_LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def _relay(pid: int) -> None:
    """Holds no fd (the pipes then close with PID 1), waits for PID 1, leaves with its status."""
    os.closerange(0, 1 << 16)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        _LIBC.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        _LIBC.signal(sig, None)  # SIG_DFL, then the same death
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def wait_gate(gate: int) -> None:
    """Waits until the parent has moved this process into the run's memory cgroup (it then writes
    one byte on the pipe ``gate``); leaves with ``SETUP_FAILED`` when the parent closed it instead."""
    ok = os.read(gate, 1) == b"1"
    os.close(gate)
    if not ok:
        os.write(2, b"sandbox setup failed: not moved into the run's memory cgroup\n")
        os._exit(SETUP_FAILED)


def enter(plan: tuple) -> None:
    """In the child's interpreter (namespaces already entered): fork into the PID namespace; the
    returning process is PID 1 inside the minimal root, limited and unprivileged.

    Args:
      plan: ``(workdir, uid, workdir_mb, ro_paths, rlimits, gate)``; ``gate`` >= 0: first wait
        on that pipe (:func:`wait_gate`), so that both processes are in the run's cgroup.
    """
    workdir, uid, workdir_mb, ro_paths, rlimits, gate = plan
    if gate >= 0:
        wait_gate(gate)
    pid = os.fork()
    if pid > 0:
        _relay(pid)
    try:
        enter_minimal_root(workdir, uid, workdir_mb, tuple(ro_paths))
        drop(tuple(map(tuple, rlimits)), uid)
    except BaseException as e:  # noqa: BLE001 (never run the program half set up, or as root)
        os.write(2, f"sandbox setup failed: {type(e).__name__}: {e}\n".encode())
        os._exit(SETUP_FAILED)
