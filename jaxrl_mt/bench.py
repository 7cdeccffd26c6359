"""The old name of the engine benchmark: ``python -m jaxrl_mt.bench sampling|scoring``.

The benchmarks live in ``jaxrl_mt.benchmarks``; this module runs ``jaxrl_mt.benchmarks.engine``.
"""

from __future__ import annotations

import sys

from jaxrl_mt.benchmarks.engine import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
