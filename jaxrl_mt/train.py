"""Train a policy: `python -m jaxrl_mt.train --config configs/rlsta.py[:preset] [--config.rl.lr=...]`.

The config file is an ml_collections file (configs/rlsta.py, configs/grpo.py); it is locked, so a
misspelt override fails at start-up. An existing workdir resumes from its newest checkpoint that
restores. Bad input (a misspelt key, a bad value, an unknown model, an unwritable workdir, a resume
with changed data or optimizer-structure fields), a checkpoint that cannot be
written or read, a failed export: one line on stderr and exit status 2 (set JAXRL_MT_TRACEBACK=1 for
the traceback); a training failure (non-finite loss): exit status 1.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file (configs/rlsta.py[:preset]).",
                                          lock_config=True)
flags.mark_flags_as_required(["config"])


def main(argv: list[str]) -> int:
    del argv
    from jaxrl_mt import cli_errors, runtime
    from jaxrl_mt.checkpointing import CheckpointError
    from jaxrl_mt.models.hf_io import ExportError
    from jaxrl_mt.models.config import ModelError
    from jaxrl_mt.parallel import maybe_initialize_distributed
    from jaxrl_mt.rl.loop import ConfigError, Trainer, TrainingError

    c = cli_errors.config_value(_CONFIG)
    runtime.setup()
    maybe_initialize_distributed(c)
    try:
        Trainer(c).run()
    except (ConfigError, TrainingError, CheckpointError, ExportError, ModelError, OSError) as e:
        if os.environ.get("JAXRL_MT_TRACEBACK"):
            raise
        print(f"error: {cli_errors.one_line(e)}", file=sys.stderr)
        return 1 if isinstance(e, TrainingError) else cli_errors.EXIT_BAD_INPUT
    return 0


def run() -> None:
    from jaxrl_mt.cli_errors import parse_flags

    app.run(lambda argv: sys.exit(main(argv)), flags_parser=parse_flags)


if __name__ == "__main__":
    run()
