"""``python -m jaxrl_mt.benchmarks NAME [ARGS]``: runs one benchmark (see the package doc)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

USAGE = ("usage: python -m jaxrl_mt.benchmarks "
         "{sampling,scoring,workload,grpo,simulator,accel,attention,tunix,device_check} [ARGS]")


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatches to the benchmark named by the first argument; returns its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    name = args[0] if args else ""
    if name in ("sampling", "scoring"):
        from jaxrl_mt.benchmarks.engine import main as run

        return int(run(args) or 0)
    if name == "workload":
        from jaxrl_mt.benchmarks.workload import main as run

        return int(run(args[1:]) or 0)
    if name == "grpo":
        from jaxrl_mt.benchmarks.grpo import main as run

        return int(run(args[1:]) or 0)
    if name == "accel":
        from jaxrl_mt.benchmarks.accel import main as run

        return int(run(args[1:]) or 0)
    if name == "device_check":
        from jaxrl_mt.benchmarks.device_check import main as run

        return int(run(args[1:]) or 0)
    if name == "attention":
        from jaxrl_mt.benchmarks.attention import main as run

        return int(run(args[1:]) or 0)
    if name == "tunix":
        from jaxrl_mt.benchmarks.tunix import main as run

        return int(run(args[1:]) or 0)
    if name == "simulator":
        from jaxrl_mt.benchmarks.simulator import main as run

        run(args[1:])
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
