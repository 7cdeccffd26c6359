"""Run model-written Python in a sandbox: nothing a model writes runs anywhere else.

Usage::

    from jaxrl_mt.tasks.sandbox import SandboxLimits, run_python

    r = run_python("assert sum([1, 2]) == 3", limits=SandboxLimits(timeout_s=2))
    r.verdict, r.reason, r.wall_s      # "passed", "", 0.1
    run_python("print(input()[::-1])", stdin="abc").stdout   # "cba\\n"

Each run is one child process: ``python -I -B`` (isolated mode, no bytecode files) started with
an empty environment (PATH, a UTF-8 locale, HOME/TMPDIR = its work directory), stdin closed (or
a sealed memory file holding the given input), a fresh temporary work directory as cwd, its own
session and process group, resource limits (CPU time, address space, file size, processes, open
files, no core dumps), and on top of that the strongest OS isolation this machine allows: a
network namespace, a PID namespace with its own /proc (the program is PID 1 and sees only its
own processes), a minimal read-only root (the interpreter and its libraries, five device nodes,
a private tmpfs work directory; no host /tmp, files or Unix sockets), and a throwaway uid (see
:mod:`jaxrl_mt.tasks.isolation` and docs/sandbox.md; a weaker mode is logged once and named, with
what it does NOT isolate, in ``SandboxResult.isolation``). A wall-clock timeout kills the whole
process group (and every process of the throwaway uid); stdout and stderr are read with a size cap.

The program text and the input reach the child as sealed memory files (no file on disk). A small
bootstrap executes the program as ``__main__`` (traceback lines point into ``main.py``) and,
only when the program ran to its end, writes a report with a per-run random nonce on a private
pipe. So a program that leaves early (``os._exit(0)``, a kill, ``sys.exit()`` where that is not
allowed) cannot pass. The bootstrap runs in the same interpreter as the program, so a program
written to find the nonce (frame inspection) could forge the report: the sandbox contains
hostile code, the verdict is meant for honest-but-wrong code.

Verdicts: ``passed`` (ran to the end), ``failed`` (an ``AssertionError``: the reason is the
failing line), ``timeout`` (wall clock or CPU limit), ``crashed`` (any other exception, a signal,
output over the cap, an early exit), ``rejected`` (refused before running: empty, over the size
cap, or not parseable by ``ast.parse``).
"""

from __future__ import annotations

import ast
import dataclasses
import math
import os
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import tempfile
import time

from jaxrl_mt.tasks import memcap
from jaxrl_mt.tasks.isolation import Plan, child_argv, isolation, kill_uid, make_preexec, new_uid

__all__ = ["VERDICTS", "SandboxLimits", "SandboxResult", "check_code", "run_python"]

VERDICTS = ("passed", "failed", "timeout", "crashed", "rejected")
TAIL_CHARS = 2000

# Runs in the child: reads the program from a sealed memfd, executes it as __main__, and reports
# "<nonce> <status> <detail>" on a private pipe only if control comes back to it.
_BOOTSTRAP = r"""
import os, sys
def _describe(e):
    import traceback
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == "main.py"]
    msg = traceback.format_exception_only(type(e), e)[-1].strip()
    line = (frames[-1].line or "")[:150] if frames else ""
    return f"line {frames[-1].lineno}: {line} -> {msg}" if frames else msg
def _boot():
    prog_fd, nonce_fd, report_fd, gate = (int(a) for a in sys.argv[1:5])
    if gate >= 0:  # wait until the parent has moved this process into the run's memory cgroup
        if os.read(gate, 1) != b"1":
            os._exit(125)
        os.close(gate)
    nonce = os.read(nonce_fd, 64)
    os.close(nonce_fd)
    with os.fdopen(prog_fd, "rb") as f:
        src = f.read()
    import linecache
    text = src.decode("utf-8", "replace")
    linecache.cache["main.py"] = (len(text), None, text.splitlines(True), "main.py")
    sys.argv[:] = ["main.py"]
    status, detail = "ok", ""
    try:
        exec(compile(src, "main.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        status, detail = ("exit", "") if e.code in (None, 0) else ("error", f"SystemExit: {e.code!r}")
    except BaseException as e:
        status, detail = ("assert" if isinstance(e, AssertionError) else "error"), _describe(e)
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except BaseException:
            pass
    os.write(report_fd, nonce + b" " + status.encode() + b" " + detail.encode("utf-8", "replace")[:1500])
    os._exit(0)
_boot()
"""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run.

    Attributes:
      timeout_s: wall-clock limit (the CPU-time limit is this rounded up, plus one second).
      memory_mb: memory of the whole run, all its processes together (a cgroup where the host
        allows one, else RLIMIT_AS x RLIMIT_NPROC within it: :mod:`jaxrl_mt.tasks.memcap`).
      max_output_bytes: cap on stdout and on stderr each; more kills the run (``crashed``).
      max_file_bytes: largest file the program may write (RLIMIT_FSIZE).
      max_processes: RLIMIT_NPROC (with the throwaway uid: the run's own processes only); lower
        under the ``rlimit`` memory bound (:func:`jaxrl_mt.tasks.memcap.split`).
      max_open_files: RLIMIT_NOFILE.
      max_code_bytes: larger programs are ``rejected``.
      workdir_mb: size of the private tmpfs work directory (``full`` isolation).
    """

    timeout_s: float = 5.0
    memory_mb: int = 1024
    max_output_bytes: int = 1 << 20
    max_file_bytes: int = 16 << 20
    max_processes: int = 16
    max_open_files: int = 64
    max_code_bytes: int = 256 << 10
    workdir_mb: int = 64

    def rlimits(self, cgroup: bool = False) -> tuple[tuple[int, int, int], ...]:
        """The ``(resource, soft, hard)`` limits of a run.

        Args:
          cgroup: whether a cgroup bounds the whole run's memory; if not, the processes and the
            address space of each are split so that their product stays within ``memory_mb``.
        """
        cpu = math.ceil(self.timeout_s) + 1
        procs, mem_mb = (self.max_processes, self.memory_mb) if cgroup else memcap.split(
            self.memory_mb, self.max_processes)
        mem = mem_mb << 20
        return (
            (resource.RLIMIT_CPU, cpu, cpu + 1),
            (resource.RLIMIT_AS, mem, mem),
            (resource.RLIMIT_FSIZE, self.max_file_bytes, self.max_file_bytes),
            (resource.RLIMIT_NPROC, procs, procs),
            (resource.RLIMIT_NOFILE, self.max_open_files, self.max_open_files),
            (resource.RLIMIT_CORE, 0, 0),
        )


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What one run gave.

    Attributes:
      verdict: one of :data:`VERDICTS`.
      reason: one short line (the failing assertion line, the exception, the limit hit), "" if passed.
      stdout: the program's stdout, whole up to the output cap (stdin/stdout tests compare it).
      stderr: the last :data:`TAIL_CHARS` characters of its stderr.
      wall_s: wall time from start to the last process gone, seconds.
      returncode: the child's exit status (negative: killed by that signal); None if never started.
      isolation: the isolation used (see :attr:`jaxrl_mt.tasks.isolation.Isolation.label`).
      memory: how the run's memory was bounded as a whole (``cgroup2``/``cgroup1``: one limit
        for all its processes; ``rlimit``: processes x address space each).
    """

    verdict: str
    reason: str
    stdout: str
    stderr: str
    wall_s: float
    returncode: int | None = None
    isolation: str = ""
    memory: str = ""

    @property
    def stdout_tail(self) -> str:
        return self.stdout[-TAIL_CHARS:]

    def to_json(self) -> dict:
        """A JSON-ready dict with the stdout tail (not the whole stdout)."""
        d = dataclasses.asdict(self)
        d["stdout"] = self.stdout_tail
        return d


def check_code(code: str, limits: SandboxLimits = SandboxLimits()) -> str:
    """Why ``code`` would be rejected before running ("" when it would run)."""
    if not isinstance(code, str) or not code.strip():
        return "empty code"
    if "\0" in code:
        return "the code contains a NUL byte"
    size = len(code.encode("utf-8", "replace"))
    if size > limits.max_code_bytes:
        return f"code is {size} bytes, over the {limits.max_code_bytes}-byte cap"
    try:
        ast.parse(code)
    except SyntaxError as e:
        return f"syntax error: line {e.lineno}: {e.msg}"
    except (ValueError, RecursionError, MemoryError) as e:
        return f"not parseable: {type(e).__name__}: {e}"
    return ""


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    import fcntl

    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    return fd


def _collect(proc: subprocess.Popen, report_fd: int, limits: SandboxLimits, deadline: float) -> tuple[dict, str]:
    """Reads stdout, stderr and the report until EOF, the deadline, or a cap; returns (bytes by name, stop)."""
    names = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr", report_fd: "report"}
    caps = {"stdout": limits.max_output_bytes, "stderr": limits.max_output_bytes, "report": 4096}
    bufs = {n: bytearray() for n in caps}
    sel = selectors.DefaultSelector()
    for fd in names:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    stop, exited_at = "", None
    try:
        while sel.get_map() and not stop:
            now = time.monotonic()
            if now >= deadline:
                stop = "timeout"
                break
            if proc.poll() is not None:
                exited_at = exited_at or now
                if now - exited_at > 0.5:  # something that outlived the child holds the pipes
                    break
            for key, _ in sel.select(timeout=min(0.05, deadline - now)):
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                name = names[key.fd]
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                bufs[name] += chunk
                if len(bufs[name]) > caps[name]:
                    stop = f"{name} over {caps[name]} bytes"
                    break
    finally:
        sel.close()
    return bufs, stop


def _classify(report: bytes, nonce: bytes, rc: int | None, stop: str, allow_exit: bool) -> tuple[str, str]:
    """(verdict, reason) from the report, the exit status and why reading stopped."""
    if stop == "timeout":
        return "timeout", "wall-clock limit reached"
    if stop:
        return "crashed", stop
    head, _, rest = report.partition(b" ")
    if head == nonce and nonce:
        status, _, detail = rest.decode("utf-8", "replace").partition(" ")
        if status == "ok" or (status == "exit" and allow_exit):
            return "passed", ""
        if status == "exit":
            return "crashed", "the program called sys.exit() before its end"
        return ("failed" if status == "assert" else "crashed"), detail.strip()
    if rc is not None and rc < 0:
        sig = signal.Signals(-rc)
        if sig == signal.SIGXCPU:
            return "timeout", "CPU-time limit reached"
        return "crashed", f"killed by {sig.name}"
    return "crashed", f"exited with status {rc} before the end of the program"


def _tail(b: bytes | bytearray, n: int = TAIL_CHARS) -> str:
    return bytes(b).decode("utf-8", "replace")[-n:]


def run_python(
    code: str, *, stdin: str | None = None, limits: SandboxLimits = SandboxLimits(), allow_exit: bool = True
) -> SandboxResult:
    """Runs ``code`` as a Python program in the sandbox.

    Args:
      code: the program (executed as ``__main__``).
      stdin: text on the program's stdin; None: stdin is closed (/dev/null).
      limits: see :class:`SandboxLimits`.
      allow_exit: whether ``sys.exit()`` / ``exit(0)`` counts as finishing (True for stdin/stdout
        programs; False for test programs, where leaving early must not pass).

    Returns:
      The :class:`SandboxResult`; never raises for anything the program does.
    """
    iso = isolation()
    why = check_code(code, limits)
    if why:
        return SandboxResult("rejected", why, "", "", 0.0, None, iso.label)
    uid = new_uid() if iso.mode in ("full", "uid") else None
    workdir = tempfile.mkdtemp(prefix="jaxrl_sandbox_")
    if iso.mode == "uid":
        os.chown(workdir, uid, uid)
    nonce = secrets.token_hex(16).encode()
    prog_fd = _memfd("main.py", code.encode("utf-8", "replace"))
    in_fd = _memfd("stdin", stdin.encode("utf-8", "replace")) if stdin is not None else None
    nonce_r, nonce_w = os.pipe()
    report_r, report_w = os.pipe()
    os.write(nonce_w, nonce)
    os.close(nonce_w)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
    cgroup, memory = memcap.for_run(limits.memory_mb, limits.max_processes)
    plan = Plan(iso.mode, workdir, uid, limits.rlimits(cgroup is not None), limits.workdir_mb, iso.ro_paths)
    start = time.monotonic()
    proc = None
    try:
        try:
            proc = _start(plan, iso.python, (prog_fd, nonce_r, report_w), in_fd, env, cgroup)
        except (OSError, subprocess.SubprocessError) as e:
            why = f"the sandbox could not start the child: {e}"
            return SandboxResult("crashed", why, "", "", time.monotonic() - start, None, iso.label, memory)
        finally:
            for fd in (prog_fd, nonce_r, report_w) + ((in_fd,) if in_fd is not None else ()):
                os.close(fd)
        bufs, stop = _collect(proc, report_r, limits, start + limits.timeout_s)
        if not stop:  # the pipes closed: let the child (in full mode, the status relay) exit by itself
            try:
                proc.wait(timeout=max(0.0, min(0.5, start + limits.timeout_s - time.monotonic())))
            except subprocess.TimeoutExpired:
                pass
    finally:
        if proc is not None:
            _kill_all(proc, uid)
        if cgroup is not None:
            cgroup.close()
        os.close(report_r)
        shutil.rmtree(workdir, ignore_errors=True)
    rc = proc.returncode
    verdict, reason = _classify(bytes(bufs["report"]), nonce, rc, stop, allow_exit)
    if verdict == "crashed" and not reason.startswith("line") and bufs["stderr"].strip():
        reason = f"{reason}; stderr: {_tail(bufs['stderr'], 200).strip().splitlines()[-1]}"
    out = bytes(bufs["stdout"]).decode("utf-8", "replace")
    return SandboxResult(verdict, reason[:500], out, _tail(bufs["stderr"]), time.monotonic() - start, rc, iso.label,
                         memory)


def _start(plan: Plan, python: str, fds: tuple[int, ...], in_fd: int | None, env: dict,
           cgroup: memcap.RunCgroup | None) -> subprocess.Popen:
    """Starts the child; with a cgroup, moves it in, then lets it go on (the gate, :attr:`Plan.gate`).

    Raises:
      OSError, subprocess.SubprocessError: it did not start, or could not be moved into the
        cgroup (then it is killed before any of the program ran).
    """
    gate_r, gate_w = os.pipe() if cgroup is not None else (-1, -1)
    full = plan.mode == "full"
    plan = dataclasses.replace(plan, gate=gate_r if full else -1)
    try:
        proc = subprocess.Popen(
            child_argv(plan, python, _BOOTSTRAP, (*map(str, fds), str(-1 if full else gate_r))),
            stdin=in_fd if in_fd is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=plan.workdir,
            env=env,
            pass_fds=fds + ((gate_r,) if gate_r >= 0 else ()),
            start_new_session=True,
            preexec_fn=make_preexec(plan),  # noqa: PLW1509 (thread-safe: see isolation.make_preexec)
        )
    except BaseException:
        if cgroup is not None:
            os.close(gate_w)
        raise
    finally:
        if gate_r >= 0:
            os.close(gate_r)
    if cgroup is not None:
        try:
            cgroup.add(proc.pid)  # from here: moving it from its own preexec cost ~10 ms a run
            os.write(gate_w, b"1")
        except OSError as e:
            _kill_all(proc, plan.uid)
            raise OSError(e.errno, f"the child could not be moved into its memory cgroup: {e.strerror}") from e
        finally:
            os.close(gate_w)
    return proc


def _kill_all(proc: subprocess.Popen, uid: int | None) -> None:
    """Kills the child's process group and, with a throwaway uid, every process of that uid."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid is not None:
        kill_uid(uid)
    proc.wait()
    for f in (proc.stdout, proc.stderr):
        f.close()
