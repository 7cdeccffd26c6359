"""One memory bound for a whole sandbox run: a cgroup where the host allows one, else split rlimits.

``RLIMIT_AS`` is per process: a run that forks ``n`` children may use ``n`` times the limit. The
sandbox therefore bounds the run as a whole, by the first of these that works on the machine
(probed once per process by :func:`memory_bound`, which really creates and removes a cgroup):

``cgroup2``
  A cgroup v2 directory per run under the caller's own cgroup, with ``memory.max`` = the run's
  limit, ``memory.swap.max`` = 0 and (where the controller is enabled) ``pids.max``. The parent
  moves the child in right after starting it, while the child waits on a gate (a pipe) before
  anything of the program runs (:meth:`RunCgroup.add`): joining from the child's own ``preexec``
  hook cost ~10 ms a run, moving it from the parent ~0. Needs ``memory`` in the caller's
  ``cgroup.subtree_control`` (it is enabled when the kernel allows it).
``cgroup1``
  The same with the cgroup v1 ``memory`` controller (hybrid hosts: ``memory.limit_in_bytes`` and
  ``memory.memsw.limit_in_bytes``).
``rlimit``
  No cgroup is writable: the run gets at most ``memory_mb // 256`` processes (and never more than
  ``max_processes``; RLIMIT_NPROC, which counts the throwaway uid's processes and threads) and
  each ``memory_mb // processes`` of address space, so ``RLIMIT_AS * RLIMIT_NPROC`` stays within
  the configured limit (1 GiB: 4 processes of 256 MiB each).

Past a cgroup's limit the kernel's OOM killer ends a process of the run (SIGKILL: ``crashed``);
``RLIMIT_AS`` (still set per process, at the whole limit) turns most single large allocations
into a ``MemoryError`` first. ``$JAXRL_SANDBOX_CGROUP=off`` forces the ``rlimit`` bound.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import secrets
import threading
import time

log = logging.getLogger(__name__)

__all__ = ["MIN_PROCESS_MB", "MemoryBound", "RunCgroup", "for_run", "memory_bound", "split"]

MIN_PROCESS_MB = 256  # the rlimit bound never gives a process less address space than this
_PREFIX = "jaxrl_sbx_"


@dataclasses.dataclass(frozen=True)
class MemoryBound:
    """How the machine bounds a run's memory.

    Attributes:
      kind: ``"cgroup2"``, ``"cgroup1"`` or ``"rlimit"``.
      base: the cgroup directory that holds the runs' cgroups ("" for ``rlimit``).
      notice: why no cgroup is used ("" otherwise).
    """

    kind: str
    base: str = ""
    notice: str = ""

    @property
    def label(self) -> str:
        """A short phrase for results and logs."""
        if self.kind == "rlimit":
            return "mem=rlimit-split"
        return f"mem={self.kind}"


def split(memory_mb: int, max_processes: int) -> tuple[int, int]:
    """``(processes, MiB of address space each)`` of the ``rlimit`` bound: the product stays
    within ``memory_mb``; at least one process."""
    procs = max(1, min(max_processes, memory_mb // MIN_PROCESS_MB))
    return procs, memory_mb // procs


def _own_cgroup(version: int) -> str:
    """The directory of this process's cgroup on the v2 (``version`` 2) or v1 memory hierarchy ("" if none)."""
    with open("/proc/self/cgroup", encoding="utf-8") as f:
        rows = [line.rstrip("\n").split(":", 2) for line in f]
    want = [r[2] for r in rows if len(r) == 3 and (r[0] == "0" if version == 2 else "memory" in r[1].split(","))]
    if not want:
        return ""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fields, (fstype, _src, opts) = pre.split(), post.split()[:3]
            ok = fstype == "cgroup2" if version == 2 else fstype == "cgroup" and "memory" in opts.split(",")
            root, point = fields[3], fields[4]
            if ok and (want[0] == root or want[0].startswith(root.rstrip("/") + "/")):
                return os.path.join(point, want[0][len(root):].lstrip("/")).rstrip("/")
    return ""


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(value)


class RunCgroup:
    """One run's cgroup: created with its limits, the child moved in, killed and removed after."""

    def __init__(self, bound: MemoryBound, name: str, memory_bytes: int, max_processes: int):
        self.bound, self.path = bound, os.path.join(bound.base, _PREFIX + name)
        os.mkdir(self.path, 0o700)
        try:
            if bound.kind == "cgroup2":
                _write(f"{self.path}/memory.max", str(memory_bytes))
                for name, value in (("memory.swap.max", "0"), ("pids.max", str(max_processes + 1))):
                    if os.path.exists(f"{self.path}/{name}"):
                        _write(f"{self.path}/{name}", value)
            else:
                _write(f"{self.path}/memory.limit_in_bytes", str(memory_bytes))
                if os.path.exists(f"{self.path}/memory.memsw.limit_in_bytes"):
                    _write(f"{self.path}/memory.memsw.limit_in_bytes", str(memory_bytes))
            self.procs_fd = os.open(f"{self.path}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            self.close()
            raise

    def add(self, pid: int) -> None:
        """Moves process ``pid`` (not its existing children) in.

        Raises:
          OSError: the kernel refused (the process is gone, the cgroup was removed).
        """
        os.write(self.procs_fd, str(pid).encode())

    def close(self) -> None:
        """Kills whatever is left in the cgroup and removes it (retries while the kernel reaps)."""
        fd = getattr(self, "procs_fd", None)
        if fd is not None:
            os.close(fd)
            self.procs_fd = None
        for i in range(200):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError as e:
                if e.errno != errno.EBUSY:
                    break
            self._kill_members()
            time.sleep(0.001 * min(i + 1, 10))
        log.warning("sandbox cgroup %s could not be removed", self.path)

    def _kill_members(self) -> None:
        if os.path.exists(f"{self.path}/cgroup.kill"):
            try:
                _write(f"{self.path}/cgroup.kill", "1")
                return
            except OSError:
                pass
        try:
            with open(f"{self.path}/cgroup.procs", encoding="ascii") as f:
                pids = [int(x) for x in f.read().split()]
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass


def _try(kind: str, base: str) -> str:
    """"" when a run's cgroup can be made under ``base`` and joined, else why not."""
    if not base or not os.path.isdir(base):
        return f"{kind}: no hierarchy mounted for this process"
    if kind == "cgroup2":
        try:
            with open(f"{base}/cgroup.subtree_control", encoding="ascii") as f:
                enabled = f.read().split()
            if "memory" not in enabled:
                _write(f"{base}/cgroup.subtree_control", "+memory")
        except OSError as e:
            return f"cgroup2: the memory controller cannot be enabled under {base} ({e.strerror})"
    try:
        cg = RunCgroup(MemoryBound(kind, base), f"probe_{os.getpid()}", 64 << 20, 4)
    except OSError as e:
        return f"{kind}: cannot create a cgroup under {base} ({e.strerror})"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (child: waits until moved, then exits)
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    try:
        cg.add(pid)
        return ""
    except OSError as e:
        return f"{kind}: a process cannot be moved into a cgroup under {base} ({e.strerror})"
    finally:
        os.close(w)
        os.waitpid(pid, 0)
        cg.close()


def _sweep(bound: MemoryBound, min_age_s: float = 600.0) -> None:
    """Removes empty run cgroups an earlier process left behind (killed before its cleanup); only
    old ones: another process's new cgroup may not have its child yet."""
    now = time.time()
    for name in os.listdir(bound.base):
        path = os.path.join(bound.base, name)
        try:
            if name.startswith(_PREFIX) and now - os.stat(path).st_mtime > min_age_s:
                os.rmdir(path)  # EBUSY while a process is in it
        except OSError:
            pass


def _find() -> MemoryBound:
    if os.environ.get("JAXRL_SANDBOX_CGROUP", "").lower() in ("0", "off", "no", "false"):
        return MemoryBound("rlimit", notice="cgroups turned off by $JAXRL_SANDBOX_CGROUP")
    if os.geteuid() != 0:
        return MemoryBound("rlimit", notice="not root: no cgroup is writable")
    notes = []
    for kind, version in (("cgroup2", 2), ("cgroup1", 1)):
        try:
            base = _own_cgroup(version)
        except OSError as e:
            notes.append(f"{kind}: {e}")
            continue
        why = _try(kind, base)
        if not why:
            bound = MemoryBound(kind, base)
            _sweep(bound)
            return bound
        notes.append(why)
    return MemoryBound("rlimit", notice="; ".join(notes))


_LOCK = threading.Lock()
_FOUND: MemoryBound | None = None


def memory_bound() -> MemoryBound:
    """How this machine bounds a run's memory (probed once per process; logged when no cgroup)."""
    global _FOUND
    with _LOCK:
        if _FOUND is None:
            _FOUND = _find()
            if _FOUND.kind == "rlimit":
                log.warning("sandbox memory bound: no cgroup (%s); each run gets RLIMIT_AS x RLIMIT_NPROC "
                            "within its memory limit", _FOUND.notice)
        return _FOUND


def for_run(memory_mb: int, max_processes: int) -> tuple[RunCgroup | None, str]:
    """The bound of one run: ``(its cgroup, or None for the rlimit split; the bound in words)``."""
    bound = memory_bound()
    if bound.kind != "rlimit":
        try:
            cg = RunCgroup(bound, f"{os.getpid()}_{secrets.token_hex(6)}", memory_mb << 20, max_processes)
            return cg, f"{bound.kind}: {memory_mb} MiB for the whole run"
        except OSError as e:
            why = f"{bound.kind} refused this run ({e.strerror})"
    else:
        why = bound.notice
    procs, each = split(memory_mb, max_processes)
    return None, f"rlimit: {procs} processes x {each} MiB ({why})"
