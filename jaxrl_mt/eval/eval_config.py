"""The typed evaluation config: the schema of configs/eval_lic.py as one frozen dataclass.

`jaxrl_mt.evaluate.normalize_config` turns the config file (a ConfigDict or a mapping) into an
:class:`EvalConfig` once, at its entry (:func:`typed_eval_config`): no unknown field, every field
present (or defaulted, for configs written before it existed) and of its type; then the values are
checked and the task selection resolved into ``tasks`` and ``sources``. The rest of the evaluation
reads only the typed, immutable result.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Mapping, Union

from ml_collections import ConfigDict

from jaxrl_mt.eval.errors import EvalError
from jaxrl_mt.typed_config import build, check_value

__all__ = ["HTTP_KEYS", "EvalConfig", "HttpSection", "typed_eval_config"]

Specs = Union[str, tuple[str, ...]]  # source specs: "a,b" (the command line) or a sequence


@dataclasses.dataclass(frozen=True)
class HttpSection:
    """The endpoint settings of an ``http:`` model, judge or user simulator (the config file's ``http_*``
    keys and ``api_key_env``; configs/eval_lic.py documents them). Every field has the default that
    configs written before it load with."""

    concurrency: int = 8  # requests in flight at once
    timeout: float = 60.0  # seconds per request attempt
    retries: int = 3
    backoff: float = 0.5  # first retry delay, doubled each retry
    deadline: float = 1800.0  # seconds one batch (a turn) may take (0: none)
    api_key_env: str = "OPENAI_API_KEY"  # the environment variable holding the key (only its name is kept)

    def check(self) -> None:
        """Raises EvalError ``config field 'http_timeout': bad value 0.0`` for the first bad value."""
        checks = (("concurrency", self.concurrency >= 1), ("timeout", self.timeout > 0), ("retries", self.retries >= 0),
                  ("backoff", self.backoff >= 0), ("deadline", self.deadline >= 0))
        for name, ok in checks:
            if not ok:
                raise EvalError(f"config field '{_FILE_KEY[name]}': bad value {getattr(self, name)!r}")

    def backend_kw(self) -> dict[str, Any]:
        """``HTTPBackend`` keyword arguments."""
        return {"max_workers": self.concurrency, "timeout": self.timeout, "max_retries": self.retries,
                "backoff": self.backoff, "deadline": self.deadline or None, "api_key_env": self.api_key_env}


# the config file's key of each HttpSection field: the one place the file's flat keys map to ``EvalConfig.http``
HTTP_KEYS = {"http_concurrency": "concurrency", "http_timeout": "timeout", "http_retries": "retries",
             "http_backoff": "backoff", "http_deadline": "deadline", "api_key_env": "api_key_env"}
_FILE_KEY = {v: k for k, v in HTTP_KEYS.items()}


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """One evaluation's settings (the fields of configs/eval_lic.py; see its comments)."""

    model: str  # builtin:NAME, HF folder, hub id, workdir:PATH or http:URL#MODEL
    dtype: str  # float32 | bfloat16
    task: str  # math | code | database | actions | a comma-separated list | all
    datasets: Mapping[str, Specs] = dataclasses.field(default_factory=dict)  # task -> source specs
    dataset: tuple[str, ...] = ()  # when set: these sources instead of `datasets`
    limit: int  # instructions per source (0: all)
    scenarios: tuple[str, ...]  # scenario kinds
    shuffle_shards: bool
    runs: int  # N conversations per instruction and scenario
    temperature: float
    top_p: float
    max_new_tokens: int  # reply budget per turn
    max_batch: int
    max_chunk_cells: int
    system_prompt: str  # "": math the template's default, other tasks their own
    protocol: str  # lic | final_turn
    verifier_mode: str  # strict | lenient
    judge: str  # rule | local | local:MODEL | http:URL#MODEL
    judge_max_new_tokens: int
    user_simulator: str  # fixed | local | local:MODEL | http:URL#MODEL
    user_max_new_tokens: int
    user_temperature: float
    strategy: str  # plain | a registered strategy (sedt, ...)
    workdir: str
    seed: int
    bootstrap: int
    plots: bool
    # fields added later: absent from older configs, they take these defaults
    mesh_shape: str = "auto"
    reuse_cache: bool = True
    enable_thinking: Union[bool, None] = None
    attention: str = "auto"
    abstain: bool = False
    http: HttpSection = dataclasses.field(default_factory=HttpSection)  # the file's http_* keys, api_key_env
    # resolved by `evaluate.normalize_config` from task / dataset / datasets (not config fields)
    tasks: tuple[str, ...] = ()
    sources: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("datasets", "sources"):  # read-only views: the config stays immutable throughout
            object.__setattr__(self, name, types.MappingProxyType(dict(getattr(self, name))))

    def to_dict(self) -> dict[str, Any]:
        """The config as plain JSON-able values in the config file's layout (the report's ``config``)."""
        out = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "http"}
        return {**out, **{k: getattr(self.http, f) for k, f in HTTP_KEYS.items()}}

    def replace(self, **changes: Any) -> EvalConfig:
        """A copy with ``changes`` (unchecked: `evaluate.normalize_config` checks values)."""
        return dataclasses.replace(self, **changes)


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return v


_RESOLVED = ("tasks", "sources")


def typed_eval_config(cfg: ConfigDict | Mapping[str, Any] | EvalConfig) -> EvalConfig:
    """The typed config of a ConfigDict or a mapping (an :class:`EvalConfig` is returned as is).

    ``scenarios`` and ``dataset`` may be a comma-separated string (the command line) or a sequence;
    the file's ``http_*`` keys and ``api_key_env`` become ``http`` (:data:`HTTP_KEYS`).

    Args:
      cfg: an ml_collections ConfigDict, a mapping of field name -> value, or an EvalConfig.

    Returns:
      The frozen config; ``tasks`` and ``sources`` are left empty (resolved by
      `evaluate.normalize_config`).

    Raises:
      EvalError: ``unknown config field(s) NAME``, ``config has no field NAME`` or ``config field
        NAME must be TYPE, got VALUE (TYPE)``.
    """
    if isinstance(cfg, EvalConfig):
        return cfg
    raw = dict(cfg.to_dict() if isinstance(cfg, ConfigDict) else cfg)
    resolved = sorted(k for k in (*_RESOLVED, "http") if k in raw)
    if resolved:
        raise EvalError(f"unknown config field(s) {', '.join(resolved)}")
    for k in ("scenarios", "dataset"):
        if isinstance(raw.get(k), str):
            raw[k] = (raw[k],)
    hints = typing.get_type_hints(HttpSection)
    raw["http"] = HttpSection(**{f: check_value(k, raw.pop(k), hints[f], EvalError) for k, f in HTTP_KEYS.items()
                                 if k in raw})
    return build(EvalConfig, raw, "", EvalError)
