"""How the sandbox walls a child process off: namespaces, a minimal read-only root, a throwaway uid.

:mod:`jaxrl_mt.tasks.sandbox` runs model-written code; this module holds the operating-system
half. The strongest mode that works on the machine is found once per process by
:func:`isolation` (a probe that really starts a child) and used for every run:

``full`` (root, Linux namespaces; measured to work on the project's machines)
  The child, before ``exec``: ``unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC |
  CLONE_NEWUTS)`` (a network namespace with only a down loopback: no network at all, not even the
  host's 127.0.0.1, and no host abstract Unix sockets; an IPC namespace: the host's SysV shared
  memory, semaphores and message queues are invisible and whatever the run makes dies with it; a
  UTS namespace with the host name ``sandbox``), mount propagation made private, the whole mount
  tree remounted read-only and ``nosuid`` with one recursive ``mount_setattr`` (per-mount remounts
  on kernels older than 5.12).
  Its fresh interpreter, still root, then runs :mod:`jaxrl_mt.tasks.sandbox_init` first: it
  forks (cheap: a small new process, not a copy of this one) into the new PID namespace, where
  the forked process is PID 1 and runs the program; the first one only relays its exit status.
  PID 1 builds a minimal root on a small tmpfs: read-only binds of the system directories the
  interpreter needs (``/usr``, ``/lib*``, ``/bin``, ``/sbin``, ``/etc/ld.so.cache``, and the
  interpreter's own directory and prefix when they lie elsewhere: :attr:`Isolation.ro_paths`),
  five device nodes (``/dev/null``, ``zero``, ``full``, ``random``, ``urandom``), a fresh
  ``/proc`` of the new PID namespace, and a fresh size-limited tmpfs at the work directory's
  path (its only writable place). Every mount is ``nosuid``, and all but the device nodes
  ``nodev``. It moves in with ``pivot_root`` and detaches the host tree, so
  no host file, host ``/tmp``, host Unix-domain socket or other process is there to reach:
  ``/proc`` lists the run's own processes only. Then resource limits, all groups dropped and
  ``setgid``/``setuid`` to a random unused uid (no capabilities left, so nothing can be
  remounted; RLIMIT_NPROC counts only its own processes) and ``PR_SET_NO_NEW_PRIVS`` (no ``exec``
  regains a privilege). When PID 1 ends, the kernel kills
  everything left in its PID namespace; every process of the uid is also killed.
``uid`` (root, namespaces refused)
  The same limits, the throwaway uid and ``PR_SET_NO_NEW_PRIVS``, on a real temporary directory.
  NOT isolated: network, SysV IPC, the host name,
  host Unix sockets, world-writable directories (/tmp), world-readable files, the process list.
``none`` (not root)
  Resource limits, ``PR_SET_NO_NEW_PRIVS``, an empty environment and a temporary directory
  only. NOT isolated: network, SysV IPC,
  host Unix sockets, every file of the calling user, the process list and ``/proc/<parent>``.

In every mode the run's memory as a whole is bounded by :mod:`jaxrl_mt.tasks.memcap` (a cgroup
per run where the host allows it; the parent moves the child in while the child waits on a gate
before anything of the program runs: :attr:`Plan.gate`).

Anything weaker than ``full`` is logged once as a warning and named in every result, with what is
not isolated (:attr:`Isolation.label`). The interpreter for the child must be executable by the
throwaway uid: a Python under /root (e.g. pyenv) is not, so the first world-executable one among
``$JAXRL_SANDBOX_PYTHON``, ``sys.executable`` and the system ``python3`` is taken.

PID 1 of a namespace receives only the signals it has a handler for from processes inside it
(``os.kill(os.getpid(), SIGTERM)`` does nothing), and ``os.getppid()`` is 0 there.
"""

from __future__ import annotations

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

from jaxrl_mt.tasks import sandbox_init

log = logging.getLogger(__name__)

__all__ = ["Isolation", "Plan", "child_argv", "isolation", "kill_uid", "make_preexec", "new_uid"]

_UID_BASE, _UID_SPAN = 2_000_000, 1 << 20  # throwaway uids: no passwd entry, own no files
# What the minimal root shows of the host (read-only; missing ones are skipped); symlinks are copied.
_SYSTEM_PATHS = (
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache", "/etc/alternatives",
)
_NOT_ISOLATED = {
    "full": "",
    "uid": (
        "network, SysV IPC, host Unix sockets, world-writable dirs (/tmp), world-readable host files, "
        "host processes (/proc)"
    ),
    "none": (
        "network, SysV IPC, host Unix sockets, the calling user's files, host processes and /proc/<parent> "
        "(environ, cmdline)"
    ),
}
with open(sandbox_init.__file__, encoding="utf-8") as _f:
    _INIT_SOURCE = _f.read()  # run by the child's interpreter before the program (full mode)


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
            "full": "netns+pidns+ipcns+utsns+min-ro-root+tmpfs+uid+nnp",
            "uid": "uid-only (degraded)",
            "none": "rlimits-only (degraded)",
        }[self.mode]
        if self.mode == "full":
            return f"{what}: {self.notice}" if self.notice else what
        return f"{what}: {self.notice}; NOT isolated: {_NOT_ISOLATED[self.mode]}"


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one child's preexec hook (and, in ``full`` mode, its own interpreter first) sets up.

    Attributes:
      mode: the isolation mode.
      workdir: the child's work directory (its cwd; in ``full`` mode a tmpfs is mounted there).
      uid: the throwaway uid (``uid``/``full`` modes), else None.
      rlimits: ``(resource, soft, hard)`` triples applied before the uid change.
      workdir_mb: tmpfs size (``full`` mode).
      ro_paths: host paths bound read-only into the minimal root (``full`` mode).
      gate: a pipe the child reads one byte from before it forks PID 1 (``full`` mode; the
        bootstrap reads it in the other modes), -1 for none: the parent writes it once it has
        moved the child into the run's memory cgroup.
    """

    mode: str
    workdir: str
    uid: int | None
    rlimits: tuple[tuple[int, int, int], ...]
    workdir_mb: int = 64
    ro_paths: tuple[str, ...] = _SYSTEM_PATHS
    gate: int = -1


def new_uid() -> int:
    """A random uid from a range no account uses (one per run)."""
    return _UID_BASE + secrets.randbelow(_UID_SPAN)


def make_preexec(plan: Plan):
    """The function ``subprocess`` runs in the child between ``fork`` and ``exec``.

    Runs after ``setsid`` (``start_new_session=True``). In ``full`` mode it only enters the
    namespaces (the rest happens in the child's own interpreter: :func:`child_argv`); otherwise
    it lowers the limits while still root and changes the uid last.

    ``preexec_fn`` is documented as unsafe in a threaded parent because the child could block on
    a lock another thread held at ``fork``. This hook takes none: it imports nothing, does not
    log, and makes only system calls (ctypes ``unshare``/``mount``/``mount_setattr``,
    ``setrlimit``, ``setgroups``/``setgid``/``setuid``; ``open`` of /proc/self/mountinfo only on
    kernels without ``mount_setattr``).
    """

    def preexec() -> None:
        if plan.mode == "full":
            sandbox_init.enter_namespaces()
        else:
            sandbox_init.drop(plan.rlimits, plan.uid)

    return preexec


def child_argv(plan: Plan, python: str, program: str, args: tuple[str, ...] = ()) -> list[str]:
    """The child's command line: ``python -I -B -c program args``; in ``full`` mode the program is
    preceded by :mod:`jaxrl_mt.tasks.sandbox_init`'s source and its ``enter(plan)`` (in its own
    namespace dict), so PID 1 is forked from a fresh interpreter, not from this process."""
    if plan.mode == "full":
        spec = (plan.workdir, plan.uid, plan.workdir_mb, plan.ro_paths, plan.rlimits, plan.gate)
        init = f'_sbx = {{"__name__": "sandbox_init"}}\nexec({_INIT_SOURCE!r}, _sbx)\n_sbx["enter"]({spec!r})\n'
        program = f"{init}del _sbx\n{program}"
    return [python, "-I", "-B", "-c", program, *args]


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
    extra = [os.path.dirname(os.path.abspath(python)), os.path.dirname(os.path.realpath(python)), *r.stdout.split()]
    for p in sorted(set(extra), key=len):  # a parent before its children; a child of a kept path is covered
        if p not in ("", "/") and not any(p == q or p.startswith(q + "/") for q in out):
            out.append(p)
    return tuple(out)


def _try_mode(mode: str, python: str, ro_paths: tuple[str, ...] = ()) -> str:
    """Starts ``python`` under ``mode`` on a trivial program; "" when it worked, else why not."""
    import resource

    uid = new_uid()
    workdir = tempfile.mkdtemp(prefix="jaxrl_sandbox_probe_")
    try:
        if mode == "uid":
            os.chown(workdir, uid, uid)
        plan = Plan(mode, workdir, uid, ((resource.RLIMIT_CORE, 0, 0),), 8, ro_paths)
        code = ("import os, socket\ns = socket.socket()\ntry:\n    s.connect(('127.0.0.1', 9))\n"
                "except OSError as e:\n    print(e.errno)\nprint(os.getpid(), os.getuid())")
        try:
            r = subprocess.run(
                child_argv(plan, python, code),
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


def _why_full_fails() -> str:
    """Enters the namespaces in a forked child to learn why that fails ("" if it does not)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (child)
        try:
            os.close(r)
            sandbox_init.enter_namespaces()
            os._exit(0)
        except BaseException as e:  # noqa: BLE001 (reported to the parent)
            os.write(w, str(e).encode()[:500])
            os._exit(1)
    os.close(w)
    msg = os.read(r, 600).decode(errors="replace")
    os.close(r)
    os.waitpid(pid, 0)
    return msg


_LOCK = threading.Lock()
_FOUND: Isolation | None = None


def _find() -> Isolation:
    if os.geteuid() != 0 or sandbox_init._LIBC is None or not sys.platform.startswith("linux"):
        why = "not running as root on Linux" if os.geteuid() != 0 else "no libc/Linux"
        return Isolation("none", sys.executable, f"{why}: no namespaces, no minimal root, no uid drop")
    pythons = [p for p in _python_candidates() if _world_executable(p)]
    if not pythons:
        return Isolation(
            "none", sys.executable, "no Python interpreter executable by an unprivileged uid; set $JAXRL_SANDBOX_PYTHON"
        )
    notes = []
    for python in pythons:
        ro_paths = _ro_paths(python)
        why = _try_mode("full", python, ro_paths)
        if not why:
            return Isolation("full", python, ro_paths=ro_paths)
        notes.append(why)
    ns_error = _why_full_fails()
    detail = "; ".join(notes) + (f"; entering the namespaces: {ns_error}" if ns_error else "")
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
