"""jaxrl_mt: multi-turn reliability for language models in JAX (RLSTA, ICPO, SeDT, LiC)."""

__version__ = "0.1.0"
