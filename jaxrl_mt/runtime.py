"""Process-level runtime setup shared by the command-line entry points."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def setup(*, quiet_absl: bool = True) -> None:
    """Enables JAX's persistent compilation cache under $JAXRL_MT_CACHE/xla and quiets library logs.

    Compiling the sampler, scorer and train step dominates short CPU runs; the cache makes a
    second run (or a resumed one) skip it. Set JAXRL_MT_NO_COMPILE_CACHE=1 to disable; a
    $JAX_COMPILATION_CACHE_DIR set by the user (jax reads it itself) is left as it is.
    """
    import jax

    from jaxrl_mt.models.registry import cache_dir

    if not os.environ.get("JAXRL_MT_NO_COMPILE_CACHE") and not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        path = cache_dir() / "xla"
        path.mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", str(path))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if quiet_absl:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.WARNING)


def load_config_file(path: str | os.PathLike, preset: str | None = None) -> Any:
    """``get_config(preset)`` of an ml_collections config file, loaded by its path.

    A config that extends another (``configs/grpo.py`` builds on ``configs/rlsta.py``) loads it
    with this, so neither ``sys.path`` nor the current directory matters.

    Raises:
      FileNotFoundError: no such file; AttributeError: the file has no ``get_config``.
    """
    import importlib.util

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} not found")
    spec = importlib.util.spec_from_file_location(f"_jaxrl_mt_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise AttributeError(f"config file {str(path)!r} has no get_config()")
    return module.get_config() if preset is None else module.get_config(preset)
