"""Train a policy: `python -m jaxrl_mt.train --config configs/rlsta.py[:preset] [--config.rl.lr=...]`.

The config file is an ml_collections file (configs/rlsta.py, configs/grpo.py); it is locked, so a
misspelt override fails at start-up. An existing workdir resumes from its last checkpoint.
"""

from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file (configs/rlsta.py[:preset]).",
                                          lock_config=True)
flags.mark_flags_as_required(["config"])


def main(argv: list[str]) -> int:
    del argv
    from jaxrl_mt import runtime
    from jaxrl_mt.parallel import maybe_initialize_distributed
    from jaxrl_mt.rl.loop import ConfigError, Trainer, TrainingError

    c = _CONFIG.value
    runtime.setup()
    maybe_initialize_distributed(c)
    try:
        Trainer(c).run()
    except (ConfigError, TrainingError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    return 0


def run() -> None:
    app.run(lambda argv: sys.exit(main(argv)))


if __name__ == "__main__":
    run()
