"""Loaders: GSM8K, RLSTA MT-Add / MT-Refine, the LiC benchmark file, synthetic, scenario files.

Every record read is checked field by field; a bad one raises :class:`DataError` with
``path:line: field 'name': expected ...``. Loaders never look outside the path they are given:
the samples shipped in ``jaxrl_mt/assets/data`` are reached with :func:`asset_path` or the
``@`` prefix of a source spec (``gsm8k:@`` = the shipped GSM8K train sample).

Source specs (:func:`load_source`):

==========================  ==========================================================
``gsm8k:FILE``              GSM8K jsonl (``question``, ``answer`` with ``#### n``), segmented
                            with the rule-based segmenter
``rlsta_add:FILE``          RLSTA MT-Add jsonl
``rlsta_refine:FILE``       RLSTA MT-Refine jsonl (corrupted shards included)
``lic:FILE[:task]``         LiC sharded-instructions JSON, one task (default ``math``);
                            ``lic:@:database`` / ``lic:@:actions``: that task's shipped sample
``synthetic:N[:steps]``     N synthetic arithmetic problems
``humaneval:FILE[:N]``      HumanEval jsonl(.gz), all problems or the first N, domain ``code``
                            (``humaneval:@`` = the 164 shipped ones); see ``jaxrl_mt.data.humaneval``
``family:SET:N[:steps[:seed]]``  N templated add/subtract problems of template set SET
                            (``train`` | ``heldout``, see :mod:`jaxrl_mt.data.families`)
``arith:SET:N[:steps[:seed]]``   N templated problems over + - * / with worked solutions (SET train|heldout)
``hf:ID[:config[:split]]``  a GSM8K-shaped Hugging Face dataset (needs the hub or its cache)
``tfds:NAME[:split]``       a GSM8K-shaped tensorflow-datasets dataset (needs the package)
``tasks:FILE``              tasks saved with :func:`save_tasks_jsonl`
==========================  ==========================================================
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from jaxrl_mt.data.fields import (
    str_list_field as _str_list,
    str_field as _str,
    shard_objs as _shard_objs,
    gold_field as _gold,
    read_jsonl as _read_jsonl,
    read_json_array as _read_json_array,
)
from jaxrl_mt.data.fields import gold_from_gsm8k_answer  # noqa: F401  (re-exported)
from jaxrl_mt.data.files import (  # noqa: F401  (re-exported: the data layer's file formats)
    load_scenarios_jsonl,
    load_tasks_jsonl,
    save_scenarios_jsonl,
    save_tasks_jsonl,
)
from jaxrl_mt.data.humaneval import code_full_prompt, load_humaneval
from jaxrl_mt.data.lic_fields import lic_task_fields, parse_literal_fields
from jaxrl_mt.data.records import DataError, ShardedTask
from jaxrl_mt.data.scenarios import join_shards
from jaxrl_mt.data.segment import segment_rule_based
from jaxrl_mt.data.synthetic import synthetic_tasks

LIC_TASKS = ("code", "database", "actions", "math", "data2text", "summary")
ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "data"
DEFAULT_ASSETS = {
    "gsm8k": "gsm8k/train_sample.jsonl",
    "rlsta_add": "rlsta/mt_add_math_train_sample.jsonl",
    "rlsta_refine": "rlsta/mt_refine_math_train_sample.jsonl",
    "lic": "lic/lic_math_format_sample.json",
    "humaneval": "humaneval/HumanEval.jsonl.gz",
}
LIC_DEFAULT_ASSETS = {  # ``lic:@:TASK``: the shipped sample of that task
    "math": "lic/lic_math_format_sample.json",
    "database": "lic/lic_database_sample.json",
    "actions": "lic/lic_actions_sample.json",
}


def asset_path(rel: str) -> Path:
    """Path of a file shipped under ``jaxrl_mt/assets/data`` (e.g. ``"gsm8k/test_sample.jsonl"``)."""
    p = ASSET_DIR / rel
    if not p.exists():
        raise DataError(f"no shipped data file {rel!r} under {ASSET_DIR}")
    return p


# --------------------------------------------------------------------------- GSM8K


def _gsm8k_tasks(
    rows: Iterable[tuple[str, str, Mapping]], *, max_shards: int, source: str, segmenter=None
) -> list[ShardedTask]:
    """Tasks from ``(where, task_id, {"question", "answer"})`` rows; every row is checked first.

    ``segmenter``: ``None`` for the rule-based one, else an object with
    ``segment(questions) -> [(target, conditions)]`` (e.g. :class:`LLMSegmenter`), called once.
    """
    checked = []
    for where, task_id, d in rows:
        checked.append((task_id, _str(d, "question", where).strip(), _gold(d, "answer", where)))
    questions = [q for _, q, _ in checked]
    if segmenter is None:
        segs = [segment_rule_based(q, max_shards) for q in questions]
        name = "rule_based"
    else:
        segs = segmenter.segment(questions)
        name = type(segmenter).__name__
    return [
        ShardedTask(
            task_id=task_id,
            domain="math",
            target=target,
            conditions=tuple(conds),
            full_prompt=question,
            answer=gold,
            metadata=(("segmenter", name), ("source", source)),
        )
        for (task_id, question, gold), (target, conds) in zip(checked, segs)
    ]


def load_gsm8k(path, *, max_shards: int = 10, split: str | None = None, segmenter=None) -> list[ShardedTask]:
    """Loads a GSM8K jsonl file and shards each question.

    Args:
      path: jsonl with ``{"question", "answer"}`` per line.
      max_shards: cap on shards per problem (target + conditions), rule-based segmenter.
      split: name used in task ids ``gsm8k/<split>/<i>`` (default: the file stem).
      segmenter: ``None`` (rule-based) or e.g. an :class:`~jaxrl_mt.data.segment.LLMSegmenter`.
    """
    split = split or Path(path).stem
    rows = ((where, f"gsm8k/{split}/{i}", d) for where, i, d in _read_jsonl(path))
    return _gsm8k_tasks(rows, max_shards=max_shards, source="gsm8k", segmenter=segmenter)


def load_gsm8k_hf(
    dataset_id: str = "openai/gsm8k",
    config: str | None = "main",
    split: str = "train",
    *,
    max_shards: int = 10,
    segmenter=None,
) -> list[ShardedTask]:
    """Loads a GSM8K-shaped dataset from the Hugging Face hub (or its local cache).

    Raises:
      DataError: the dataset cannot be loaded (offline, unknown id) or a record is malformed.
    """
    try:
        import datasets  # noqa: PLC0415 - optional at run time
    except ImportError as e:  # pragma: no cover
        raise DataError(f"hf:{dataset_id}: the 'datasets' package is not installed") from e
    try:
        ds = datasets.load_dataset(dataset_id, config, split=split)
    except Exception as e:  # noqa: BLE001 - datasets raises many kinds
        raise DataError(f"hf:{dataset_id}: cannot load ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    name = dataset_id.replace("/", "_")
    rows = ((f"hf:{dataset_id}:{split}:{i}", f"hf/{name}/{split}/{i}", d) for i, d in enumerate(ds))
    return _gsm8k_tasks(rows, max_shards=max_shards, source="hf", segmenter=segmenter)


def load_gsm8k_tfds(
    name: str = "gsm8k", split: str = "train", *, data_dir: str | None = None, max_shards: int = 10, segmenter=None
) -> list[ShardedTask]:
    """Loads a GSM8K-shaped tensorflow-datasets dataset (``question``/``answer`` text features).

    Raises:
      DataError: tensorflow-datasets is not installed, or the dataset cannot be loaded.
    """
    try:
        import tensorflow_datasets as tfds  # noqa: PLC0415 - optional extra [tfds]
    except ImportError as e:
        raise DataError(f"tfds:{name}: tensorflow-datasets is not installed (pip install jaxrl_mt[tfds])") from e
    try:
        ds = tfds.load(name, split=split, data_dir=data_dir)
    except Exception as e:  # noqa: BLE001
        raise DataError(f"tfds:{name}: cannot load ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    rows = (
        (
            f"tfds:{name}:{split}:{i}",
            f"tfds/{name}/{split}/{i}",
            {k: (v.decode("utf-8") if isinstance(v, bytes) else v) for k, v in ex.items()},
        )
        for i, ex in enumerate(tfds.as_numpy(ds))
    )
    return _gsm8k_tasks(rows, max_shards=max_shards, source="tfds", segmenter=segmenter)


# --------------------------------------------------------------------------- RLSTA


def load_rlsta_add(path) -> list[ShardedTask]:
    """Loads RLSTA's MT-Add jsonl: ``{"question", "answer", "shards", "task_id"}``.

    ``shards[0]`` is the target, the rest are the conditions; the full prompt is the original
    GSM8K question and the answer its gold number.
    """
    out = []
    for where, _, d in _read_jsonl(path):
        task_id = _str(d, "task_id", where)
        question = _str(d, "question", where)
        shards = _str_list(d, "shards", where, min_len=1)
        if len(shards) < 2:
            raise DataError(
                f"{where}: field 'shards': expected a target and at least one condition, got {len(shards)} shard"
            )
        out.append(
            ShardedTask(
                task_id=task_id,
                domain="math",
                target=shards[0].strip(),
                conditions=tuple(s.strip() for s in shards[1:]),
                full_prompt=question.strip(),
                answer=_gold(d, "answer", where),
                metadata=(("source", "rlsta_add"),),
            )
        )
    return out


def load_rlsta_refine(path) -> list[ShardedTask]:
    """Loads RLSTA's MT-Refine jsonl.

    Fields: ``task_id``, ``shards`` and ``modified_shard`` (lists of ``{"shard_id", "shard"}``),
    ``modification_type``, ``answer`` (the ORIGINAL problem's solution). The lowest shard id is
    the target. A modified shard identical to its original is not a corruption and becomes
    ``None`` (metadata ``identical_modified`` counts them); the full prompt is rebuilt from the
    clean shards (the file has no question).
    """
    out = []
    for where, _, d in _read_jsonl(path):
        task_id = _str(d, "task_id", where)
        shards = _shard_objs(d, "shards", where)
        if len(shards) < 2:
            raise DataError(
                f"{where}: field 'shards': expected a target and at least one condition, got {len(shards)} shard"
            )
        mtype = _str(d, "modification_type", where)
        modified = _shard_objs(d, "modified_shard", where, allow_empty_list=True)
        ids = [s["shard_id"] for s in shards]
        for m in modified:
            if m["shard_id"] not in ids:
                raise DataError(f"{where}: field 'modified_shard': shard_id {m['shard_id']} is not in 'shards' {ids}")
            if m["shard_id"] == ids[0]:
                raise DataError(f"{where}: field 'modified_shard': shard_id {m['shard_id']} is the target shard")
        answer = _gold(d, "answer", where)
        target, conds = shards[0]["shard"].strip(), tuple(s["shard"].strip() for s in shards[1:])
        mod = {m["shard_id"]: m["shard"].strip() for m in modified}
        corrupted, identical = [], 0
        for s, c in zip(shards[1:], conds):
            m = mod.get(s["shard_id"])
            if m is not None and m == c:
                identical += 1
                m = None
            corrupted.append(m)
        out.append(
            ShardedTask(
                task_id=task_id,
                domain="math",
                target=target,
                conditions=conds,
                full_prompt=join_shards(target, conds),
                answer=answer,
                corrupted=tuple(corrupted),
                metadata=(
                    ("identical_modified", identical),
                    ("modification_type", mtype),
                    ("source", "rlsta_refine"),
                ),
            )
        )
    return out


# --------------------------------------------------------------------------- LiC


def load_lic(path, task: str = "math") -> list[ShardedTask]:
    """Loads one task of the LiC sharded-instructions JSON (the whole 600-instruction file).

    Every record is checked for ``task_id``, ``task`` (one of :data:`LIC_TASKS`) and ``shards``
    (objects with integer ``shard_id``); records of the selected task are checked further: shard
    texts non-empty, and for ``math`` a ``question`` and a GSM8K ``answer``. Shard ids are
    sorted; the first is the high-level intent (the target).

    Non-math tasks: the full prompt is the first text field among ``question``,
    ``fully_specified_question``, ``query``, ``instruction`` (code: the HumanEval ``prompt`` or the LiveCodeBench
    ``question_content`` first, see ``humaneval.code_full_prompt``; a BFCL message list gives its user
    contents; else the joined shards); the answer is ``answer``/``reference_answer``/
    ``reference_sql``/``solution`` as text (else ""); the task-specific fields are kept as JSON
    text in metadata ``lic_extra``. Fields stored as Python-literal strings (``function``,
    ``reference_answer``, ``schema_tables``, ``shards``) are parsed first
    (:mod:`jaxrl_mt.data.lic_fields`); database and actions records are checked for their
    fields (``db_id``/``schema_sql``/``reference_sql``; ``function``/``reference_answer``/
    ``test_category``). LiC's ``summary`` shards carry document ids, not text, and are rejected
    with a DataError.

    Raises:
      DataError: ``path:line: field ...`` for a malformed record, an unknown task, or naming the file:
        not UTF-8 (the byte offset), or nested too deeply to parse (e.g. 200,000 ``[``).
    """
    if task not in LIC_TASKS:
        raise DataError(f"unknown LiC task {task!r}; valid tasks: {', '.join(LIC_TASKS)}")
    try:
        return _lic_tasks(path, task)
    except UnicodeDecodeError as e:
        raise DataError(f"{Path(path)}: not UTF-8 (byte {e.start}: {e.object[e.start:e.start + 1]!r})") from None
    except RecursionError:
        raise DataError(f"{Path(path)}: a record is nested too deeply to parse") from None


def _lic_tasks(path, task: str) -> list[ShardedTask]:
    """The records of ``task`` in a LiC file (``load_lic`` without its file-level error handling)."""
    out = []
    for rec, (where, d) in enumerate(_read_json_array(path)):
        task_id = _str(d, "task_id", where)
        rec_task = _str(d, "task", where)
        if rec_task not in LIC_TASKS:
            raise DataError(f"{where}: field 'task': expected one of {', '.join(LIC_TASKS)}, got {rec_task!r}")
        if rec_task != task:
            if not isinstance(d.get("shards"), str):
                _shard_objs(d, "shards", where, text=False)
            continue
        d = parse_literal_fields(d, f"{where} (record {rec})")
        shards = _shard_objs(d, "shards", where)
        target, conds = shards[0]["shard"].strip(), tuple(s["shard"].strip() for s in shards[1:])
        if task == "math":
            full_prompt = _str(d, "question", where).strip()
            answer = (
                _gold(d, "answer", where) if "####" in str(d.get("answer", "")) else _str(d, "answer", where).strip()
            )
            extra = {}
        else:
            full_prompt, answer, extra = lic_task_fields(d, task, f"{where} (record {rec})")
            if task == "code":
                full_prompt = code_full_prompt(d) or full_prompt
            full_prompt = full_prompt or join_shards(target, conds)
        meta = {"source": "lic", "lic_task": task}
        if extra:
            meta["lic_extra"] = json.dumps(
                dict(sorted(extra.items())), ensure_ascii=False
            )  # nested order kept (spec order)
        out.append(
            ShardedTask(
                task_id=task_id,
                domain=task,
                target=target,
                conditions=conds,
                full_prompt=full_prompt,
                answer=answer,
                metadata=tuple(sorted(meta.items())),
            )
        )
    return out


# --------------------------------------------------------------------------- task / scenario files


# --------------------------------------------------------------------------- source specs

SOURCE_KINDS = ("gsm8k", "rlsta_add", "rlsta_refine", "lic", "synthetic", "hf", "tfds", "tasks", "humaneval", "family",
                "arith")


def _resolve(kind: str, file: str) -> str:
    if file == "@":
        if kind not in DEFAULT_ASSETS:
            raise DataError(f"source {kind!r} has no shipped sample; valid: {', '.join(DEFAULT_ASSETS)}")
        return str(asset_path(DEFAULT_ASSETS[kind]))
    if file.startswith("@"):
        return str(asset_path(file[1:]))
    return file


def load_source(spec: str, *, segmenter=None) -> list[ShardedTask]:
    """Loads tasks from a source spec such as ``"gsm8k:data/train.jsonl"`` (see module doc).

    A FILE starting with ``@`` names a shipped sample: ``@`` alone is the default one for the
    source, ``@gsm8k/test_sample.jsonl`` a given one. ``segmenter`` (e.g. an ``LLMSegmenter``)
    replaces the rule-based segmenter for the sources that need segmenting (gsm8k, hf, tfds).

    Raises:
      DataError: unknown source kind (listing the valid ones) or bad arguments.
    """
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in SOURCE_KINDS:
        raise DataError(f"unknown source {spec!r}; expected KIND:ARG with KIND one of {', '.join(SOURCE_KINDS)}")
    if not rest:
        raise DataError(f"source {spec!r}: missing argument after '{kind}:'")
    if kind == "gsm8k":
        return load_gsm8k(_resolve(kind, rest), segmenter=segmenter)
    if kind == "rlsta_add":
        return load_rlsta_add(_resolve(kind, rest))
    if kind == "rlsta_refine":
        return load_rlsta_refine(_resolve(kind, rest))
    if kind == "tasks":
        return load_tasks_jsonl(_resolve(kind, rest))
    if kind == "lic":
        file, task = rest, "math"
        head, sep2, tail = rest.rpartition(":")
        if sep2 and tail in LIC_TASKS:
            file, task = head, tail
        if file == "@" and task in LIC_DEFAULT_ASSETS:
            file = "@" + LIC_DEFAULT_ASSETS[task]
        return load_lic(_resolve(kind, file), task=task)
    if kind == "humaneval":
        file, sep2, tail = rest.rpartition(":")
        if not (sep2 and tail.isdigit()):
            file, tail = rest, ""
        return load_humaneval(_resolve(kind, file), limit=int(tail) if tail else None)
    if kind == "synthetic":
        parts = rest.split(":")
        try:
            n = int(parts[0])
            steps = int(parts[1]) if len(parts) > 1 else 2
        except ValueError:
            raise DataError(f"source {spec!r}: expected synthetic:N[:steps] with integers") from None
        return synthetic_tasks(n, steps=steps)
    if kind in ("family", "arith"):
        return _family_source(spec, rest, kind)
    if kind == "hf":
        parts = rest.split(":")
        dataset_id = parts[0]
        config = parts[1] if len(parts) > 1 and parts[1] else ("main" if dataset_id.endswith("gsm8k") else None)
        split = parts[2] if len(parts) > 2 else "train"
        return load_gsm8k_hf(dataset_id, config, split, segmenter=segmenter)
    if kind == "tfds":
        parts = rest.split(":")
        return load_gsm8k_tfds(parts[0], parts[1] if len(parts) > 1 else "train", segmenter=segmenter)
    raise DataError(f"unhandled source {kind!r}")  # pragma: no cover


def _family_source(spec: str, rest: str, kind: str = "family") -> list[ShardedTask]:
    """``family|arith:SET:N[:steps[:seed]]`` (:func:`jaxrl_mt.data.families.family_tasks`,
    :func:`jaxrl_mt.data.arith.arith_tasks`)."""
    from jaxrl_mt.data.arith import arith_tasks
    from jaxrl_mt.data.families import family_tasks

    parts = rest.split(":")
    try:
        if not 2 <= len(parts) <= 4:
            raise ValueError
        nums = [int(x) for x in parts[1:]]
    except ValueError:
        raise DataError(f"source {spec!r}: expected {kind}:SET:N[:steps[:seed]] with integers") from None
    n, steps, seed = (nums + [1, 0])[:3] if len(nums) == 1 else (nums + [0])[:3]
    make = arith_tasks if kind == "arith" else family_tasks
    try:
        return make(parts[0], n, steps=steps, seed=seed)
    except DataError as e:
        raise DataError(f"source {spec!r}: {e}") from None
