"""Process-level runtime setup shared by the command-line entry points."""

from __future__ import annotations

import os


def setup(*, quiet_absl: bool = True) -> None:
    """Enables JAX's persistent compilation cache under $JAXRL_MT_CACHE/xla and quiets library logs.

    Compiling the sampler, scorer and train step dominates short CPU runs; the cache makes a
    second run (or a resumed one) skip it. Set JAXRL_MT_NO_COMPILE_CACHE=1 to disable.
    """
    import jax

    from jaxrl_mt.models.registry import cache_dir

    if not os.environ.get("JAXRL_MT_NO_COMPILE_CACHE"):
        path = cache_dir() / "xla"
        path.mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", str(path))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if quiet_absl:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.WARNING)
