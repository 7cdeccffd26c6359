"""Bad input at start-up as one line on stderr and exit status 2, for the command-line entry points.

    app.run(main, flags_parser=cli_errors.parse_flags)   # a misspelt --config.rl.lrr=1 is one line

A misspelt config key, a bad override value, a missing config file or preset, an unknown flag:
``error: --config.rl.lrr=1: no config field 'lrr' (did you mean 'lr'?)``. Set
``JAXRL_MT_TRACEBACK=1`` to get the full traceback instead.
"""

from __future__ import annotations

import ast
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import NoReturn, Sequence

EXIT_BAD_INPUT = 2


def one_line(message: object) -> str:
    """``message`` with its whitespace (newlines included) collapsed to single spaces."""
    return " ".join(str(message).split())


def fail(message: object) -> NoReturn:
    """Prints ``error: <message>`` (one line) to stderr and exits with status 2."""
    print(f"error: {one_line(message)}", file=sys.stderr, flush=True)
    sys.exit(EXIT_BAD_INPUT)


def _unrepr(text: str) -> str:
    """ml_collections wraps a KeyError's repr in another exception: undo the quoting."""
    for _ in range(2):
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            try:
                text = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                break
    return text


def flag_error_message(e: BaseException, argv: Sequence[str]) -> str:
    """One line describing why parsing the command line failed."""
    text = _unrepr(str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e))
    unknown = re.match(r"'(\w+)'\s+Did you mean \"(\w+)\"", " ".join(text.split()))
    bare = re.fullmatch(r"'?(\w+)'?", text.strip()) if isinstance(e, (KeyError, AttributeError)) else None
    if unknown or bare:
        key = (unknown or bare).group(1)
        where = next((a for a in argv if a.startswith("--config.")
                      and key in a[len("--config."):].split("=")[0].split(".")), "--config")
        hint = f" (did you mean '{unknown.group(2)}'?)" if unknown else ""
        return f"{where}: no config field '{key}'{hint}"
    if "Traceback (most recent call last):" in text:  # a config file that raised: its first and last lines
        head, _, tb = text.partition("Traceback (most recent call last):")
        last = [ln for ln in tb.splitlines() if ln.strip()][-1:]
        return one_line(head).rstrip(":") + (": " + last[0].strip() if last else "")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] + (f": {lines[-1]}" if len(lines) > 1 else "") if lines else type(e).__name__


def parse_flags(argv: list[str]) -> list[str]:
    """absl ``flags_parser``: parses the command line; a bad flag or config override is one line, exit 2."""
    from absl import flags

    try:
        return flags.FLAGS(argv)
    except Exception as e:  # config_flags raises AttributeError, KeyError, OSError, flags.Error, ...
        if os.environ.get("JAXRL_MT_TRACEBACK"):
            raise
        fail(flag_error_message(e, argv[1:]))


def config_value(holder: object) -> object:
    """``holder.value`` of a config flag; a config file that failed to load is one line, exit 2."""
    try:
        value = holder.value  # type: ignore[attr-defined]
        if value is not None:
            _ = value.keys  # a config that failed to load raises on first use
        return value
    except Exception as e:  # a missing or failing config file (ml_collections defers the error to here)
        if os.environ.get("JAXRL_MT_TRACEBACK"):
            raise
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        fail(f"--config: {lines[-1] if lines else type(e).__name__}")


def check_writable_dir(path: str | os.PathLike[str], what: str) -> None:
    """Creates ``path`` (a folder) and writes a probe file in it.

    Raises:
      OSError: ``<what> <path> is not writable (<cause>)``, one line.
    """
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OSError(f"{what} {p} is not writable (a file, not a folder)")
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".write-probe-"):
            pass
    except OSError as e:
        raise OSError(f"{what} {p} is not writable ({e.strerror or e})") from None
