"""Benchmarks, each against a reference implementation on the same weights and inputs, same run.

    python -m jaxrl_mt.benchmarks sampling|scoring [...]   # engine.py: sampler / scorer vs transformers
    python -m jaxrl_mt.benchmarks grpo [...]               # grpo.py: one GRPO step vs TRL's GRPOTrainer
    python -m jaxrl_mt.benchmarks simulator [...]          # simulator.py: LiC simulator vs plain generation
    python -m jaxrl_mt.benchmarks accel [...]              # accel.py: GPU/TPU rates vs the chip's peaks
    python -m jaxrl_mt.benchmarks attention [...]          # attention.py: scorer time / RSS per attention impl
    python -m jaxrl_mt.benchmarks device_check [...]       # device_check.py: tpu/device_check.sh's parts
    python -m jaxrl_mt.memory_table --measured --step      # step_memory.py: the RLSTA step's compiled memory

Each module also runs alone (``python -m jaxrl_mt.benchmarks.engine sampling``, ...).
Benchmarks are entry points: they import the engine and the methods; nothing imports them but the
other entry point ``memory_table``, whose ``--step`` mode is ``step_memory``.
"""
