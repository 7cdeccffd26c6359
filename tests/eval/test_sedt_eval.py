"""The SeDT evaluation: its arms see the same histories and seeds, differ only where they should.

Model-backed tests use the session's tiny random Llama with the embedded model's tokenizer and
chat template (``tiny_chat_model_dir`` in conftest); a scripted subclass of the real Sampler
rewrites the final answers of one case so that the annotation decides the outcome.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import pytest

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.conversations import ConversationRun
from jaxrl_mt.eval.sedt_eval import (CONTROL, DEFAULT_SOURCE, NO_FORMAT, PLAIN, SEDT, SEDT_NC, main, plan, report_md,
                                     results_from_records, run_blocks, run_eval, step_differences)
from jaxrl_mt.sampling import SamplingConfig
from jaxrl_mt.sedt import (CONFIRMED, PROMPT_HEADER, RESTATE_HEADER, UNCERTAIN, SeDTConfig, annotate, format_prompt,
                           restate_prompt, with_answer_format)
from tests.sampler_spy import RecordingSampler

FMT = 'Solve it step by step and end with "The answer is <number>."'
ANCHOR = "Compute the final numeric answer to the word problem"
ALL_ARMS = [NO_FORMAT, PLAIN, CONTROL, SEDT_NC, SEDT]


def strip_annotation(prompt: str) -> str:
    """SeDT's final message with its annotation removed by hand (header, tuple wrappers, label hint)."""
    p = prompt.replace(PROMPT_HEADER, RESTATE_HEADER).replace(" Use every CONFIRMED message.", "")
    return re.sub(rf"^\(\d+\.\d\d, (?:{CONFIRMED}|{UNCERTAIN}), (.*)\)$", r"\1", p, flags=re.M)


# --------------------------------------------------------------------------- pure


def test_control_prompt_is_sedt_prompt_minus_the_annotation():
    shards = ["How many clips did Natalia sell?", 'She sold 48 "clips" in April.', "Half as many in May."]
    ann = annotate(shards, [0.9, 0.4, 0.7], ANCHOR, SeDTConfig())
    sedt, control = format_prompt(ann, FMT), restate_prompt(shards, ANCHOR, FMT)
    assert control == strip_annotation(sedt)
    assert control == ('Here is everything I told you, one message per line.\n"How many clips did Natalia sell?"\n'
                       '"She sold 48 \\"clips\\" in April."\n"Half as many in May."\n'
                       "Task: Compute the final numeric answer to the word problem. " + FMT)
    assert sedt != control and "CONFIRMED" in sedt and not re.search("CONFIRMED|UNCERTAIN|return-to-go", control)
    assert restate_prompt(shards, ANCHOR) == strip_annotation(format_prompt(ann))  # without a format, too
    assert with_answer_format("Half as many in May. ", FMT) == "Half as many in May.\n" + FMT
    assert with_answer_format("Half as many in May.", "") == "Half as many in May."


def test_step_differences_by_hand():
    m = {NO_FORMAT: {"P": 10.0, "A90": 5.0, "U90_10": 20.0}, PLAIN: {"P": 30.0, "A90": 5.0, "U90_10": 10.0},
         CONTROL: {"P": 25.0, "A90": 0.0, "U90_10": 40.0}, SEDT_NC: {"P": 40.0, "A90": 10.0, "U90_10": 30.0},
         SEDT: {"P": 40.0, "A90": 10.0, "U90_10": 30.0}}
    c = {NO_FORMAT: 1, PLAIN: 3, CONTROL: 2, SEDT_NC: 5, SEDT: 5}
    got = {d["from"] + ">" + d["to"]: (d["dP"], d["dA90"], d["dU90_10"], d["dcorrect"]) for d in step_differences(m, c)}
    assert got == {f"{NO_FORMAT}>{PLAIN}": (20.0, 0.0, -10.0, 2), f"{PLAIN}>{CONTROL}": (-5.0, -5.0, 30.0, -1),
                   f"{CONTROL}>{SEDT_NC}": (15.0, 10.0, -10.0, 3), f"{SEDT_NC}>{SEDT}": (0.0, 0.0, 0.0, 0)}
    del m[NO_FORMAT]  # --no-format: no format-only step
    assert [d["from"] for d in step_differences(m, c)] == [PLAIN, CONTROL, SEDT_NC]


def test_default_source_is_held_out_and_bad_arguments_are_one_line(capsys):
    assert DEFAULT_SOURCE == "gsm8k:@gsm8k/test_sample.jsonl"
    runs = plan(DEFAULT_SOURCE, 1, 2)
    assert [r.conv_id for r in runs] == ["gsm8k/test_sample/0|sharded|0", "gsm8k/test_sample/0|sharded|1"]
    assert runs[0].meta["answer"] == "18" and "Janet" in runs[0].user_turns[1]  # GSM8K test.jsonl line 1
    train = {r.user_turns[0] for r in plan("gsm8k:@", 64, 1)}
    assert not train & {r.user_turns[0] for r in plan(DEFAULT_SOURCE, 64, 1)}  # no question of the training sample
    assert main(["--problems", "0", "--out", "/nonexistent"]) == 2
    assert "--problems, --runs and --block must be >= 1" in capsys.readouterr().err
    assert main(["--problems", "2", "--block", "0", "--out", "/nonexistent"]) == 2


# --------------------------------------------------------------------------- with a (tiny) model


class AnnotationReader(RecordingSampler):
    """Answers right (72) exactly when the prompt carries SeDT's annotation header, else wrong (50)."""

    def generate_ids(self, prompts, sampling, **kw):
        res = super().generate_ids(prompts, sampling, **kw)
        texts = ["The answer is 72." if "(return-to-go, label, message)" in self.tokenizer.decode(p)
                 else "The answer is 50." for p in prompts]
        return dataclasses.replace(res, texts=texts)


def _sampler(m, cls=RecordingSampler):
    return cls(m.params, m.cfg, m.tokenizer, eos_ids=m.eos_ids, pad_id=m.pad_id, max_batch=4, min_prompt_bucket=512)


@pytest.mark.parametrize("keep_history,no_format", [(False, False), (True, True)])
def test_arms_share_histories_seeds_and_format(tiny_model, keep_history, no_format):
    s = _sampler(tiny_model)
    runs = plan(DEFAULT_SOURCE, 2, 2)
    cfg = SeDTConfig(keep_history=keep_history, self_correct=False)
    if no_format:
        cfg = dataclasses.replace(cfg, answer_formats=())
    results, records = run_eval(s, runs, SamplingConfig(max_new_tokens=6), cfg=cfg, seed=5)
    arms = ALL_ARMS[1:] if no_format else ALL_ARMS
    assert results["arms"] == arms and set(results["metrics"]) == set(arms)
    assert results["answer_format"] == ([""] if no_format else [FMT])
    finals = s.calls[-(len(arms) - 1):]  # one call per arm (SeDT without correction shares SeDT's call)
    assert len({seed for _, seed in finals}) == 1  # the same seed for every arm's final turn
    assert all(len(p) == 4 for p, _ in finals)
    tok = tiny_model.tokenizer
    for i, rec in enumerate(records):
        hist = []
        for h in rec["history"]:
            hist += [{"role": "user", "content": h["user"]}, {"role": "assistant", "content": h["assistant"]}]
        final = rec["user_turns"][-1]
        assert [h["user"] for h in rec["history"]] == rec["user_turns"][:-1]
        msgs = {name: a["message"] for name, a in rec["arms"].items()}
        assert msgs[SEDT] == msgs[SEDT_NC] and strip_annotation(msgs[SEDT]) == msgs[CONTROL]
        assert msgs[PLAIN] == (final if no_format else final + "\n" + FMT)
        for name in arms[1:]:  # the same instruction ends every arm's final message (or none does)
            assert msgs[name].endswith(FMT) != no_format and (FMT in msgs[name]) != no_format
        if not no_format:
            assert msgs[NO_FORMAT] == final
        # the prompts the model got: the same history (or none for the rewritten arms without keep_history)
        arm_calls = [a for a in arms if a != SEDT_NC]
        for name, (prompts, _) in zip(arm_calls, finals):
            shared = hist if (name in (NO_FORMAT, PLAIN) or keep_history) else []
            want = encode_prompt(tok, shared + [{"role": "user", "content": msgs[name]}], system=None)
            assert prompts[i] == want, name
    assert [d["to"] for d in results["steps"]] == arms[1:]
    for d in results["steps"]:
        assert d["dP"] == pytest.approx(results["metrics"][d["to"]]["P"] - results["metrics"][d["from"]]["P"])
    assert results["sedt"]["triggered"] == 0 and results["sedt"]["replaced"] == 0  # self_correct=False
    rep = report_md(results)
    assert ("No arm gets an answer-format instruction" in rep) == no_format
    assert (f"The format-only difference is `{PLAIN}` - `{NO_FORMAT}`" in rep) != no_format


def _clip_runs(n_tasks: int, n_runs: int) -> list[ConversationRun]:
    turns = ["How many clips did Natalia sell altogether in April and May?",
             "Natalia sold clips to 48 of her friends in April.", "She sold half as many clips in May."]
    return [ConversationRun(conv_id=f"clips{t}|sharded|{r}", system=None, user_turns=list(turns),
                            meta={"task_id": f"clips{t}", "run": r, "answer": "72", "domain": "math",
                                  "n_planned": 3}) for t in range(n_tasks) for r in range(n_runs)]


def test_a_case_where_only_the_annotation_changes_the_outcome(tiny_model):
    """A policy that answers right only when it sees the annotation: the whole gain lands on the annotation step."""
    s = _sampler(tiny_model, AnnotationReader)
    results, records = run_eval(s, _clip_runs(2, 2), SamplingConfig(max_new_tokens=4), cfg=SeDTConfig(), seed=0)
    p = {name: results["metrics"][name]["P"] for name in results["arms"]}
    assert p == {NO_FORMAT: 0.0, PLAIN: 0.0, CONTROL: 0.0, SEDT_NC: 100.0, SEDT: 100.0}
    assert results["correct"] == {NO_FORMAT: 0, PLAIN: 0, CONTROL: 0, SEDT_NC: 4, SEDT: 4}
    steps = {d["to"]: d["dP"] for d in results["steps"]}
    assert steps == {PLAIN: 0.0, CONTROL: 0.0, SEDT_NC: 100.0, SEDT: 0.0}
    # every problem moves from 0 to 100 on the annotation step and nowhere else: certain intervals
    assert {d["to"]: d["dP_ci"] for d in results["steps"]} == {PLAIN: (0.0, 0.0), CONTROL: (0.0, 0.0),
                                                              SEDT_NC: (100.0, 100.0), SEDT: (0.0, 0.0)}
    assert results["P_ci"][CONTROL] == (0.0, 0.0) and results["P_ci"][SEDT] == (100.0, 100.0)
    assert results["paired"] == {"plain_only": 0, "sedt_only": 4}
    # a triggered correction of a numbered answer is never swapped in under the default guard
    assert results["sedt"]["replaced"] == 0 and results["sedt"]["helped"] == 0
    assert all(r["arms"][CONTROL]["answer"] == "The answer is 50." for r in records)
    assert "| the relevance annotation (return-to-go, labels) | " in report_md(results)


def test_coverage_guard_ablation_counts_helped_and_hurt(tiny_model):
    """Under the coverage-only guard a correction can replace an answer; the counts follow the verifier."""
    s = _sampler(tiny_model)
    cfg = SeDTConfig(guard="coverage", trigger_uncertain_frac=-1.0)  # always trigger
    results, records = run_eval(s, plan(DEFAULT_SOURCE, 2, 2), SamplingConfig(max_new_tokens=6), cfg=cfg, seed=0)
    sd = results["sedt"]
    assert sd["guard"] == "coverage" and sd["triggered"] == 4
    assert sd["helped"] + sd["hurt"] + sd["neutral"] == sd["replaced"] == sum(r["sedt"]["replaced"] for r in records)
    for r in records:  # the SeDT arm's answer is the correction exactly when replaced
        a = r["arms"][SEDT]["answer"]
        assert a == (r["sedt"]["correction"] if r["sedt"]["replaced"] else r["sedt"]["original"])


def _json(x):
    return json.loads(json.dumps(x))


def test_blocks_are_written_as_they_finish_and_a_killed_run_resumes_to_the_same_records(tiny_model, tmp_path):
    sampling, cfg, settings = SamplingConfig(max_new_tokens=6), SeDTConfig(), {"model": "tiny", "seed": 3}
    full, _ = run_blocks(_sampler(tiny_model), plan(DEFAULT_SOURCE, 3, 2), sampling, cfg=cfg, seed=3,
                         out=tmp_path / "a", block=2, settings=settings)
    runs = plan(DEFAULT_SOURCE, 3, 2)
    assert [r["conv_id"] for r in full] == [r.conv_id for r in runs]
    assert [r["block"] for r in full] == [0, 0, 0, 0, 1, 1]  # 2 problems x 2 runs, then 1 problem x 2 runs
    on_disk = [json.loads(line) for line in (tmp_path / "a" / "transcripts.jsonl").read_text().splitlines()]
    assert _json(full) == on_disk
    # block 0 is a one-block run at the base seed; block 1 runs at another seed
    _, first = run_eval(_sampler(tiny_model), runs[:4], sampling, cfg=cfg, seed=3)
    assert _json([{k: v for k, v in r.items() if k != "block"} for r in full[:4]]) == _json(first)
    # a kill while block 1 was being written: its blocks.jsonl line missing, its last record cut in half
    b = tmp_path / "b"
    shutil.copytree(tmp_path / "a", b)
    (b / "blocks.jsonl").write_text((b / "blocks.jsonl").read_text().splitlines()[0] + "\n")
    text = (b / "transcripts.jsonl").read_text()
    (b / "transcripts.jsonl").write_text(text[: len(text) - 40])
    s = _sampler(tiny_model)
    again, _ = run_blocks(s, plan(DEFAULT_SOURCE, 3, 2), sampling, cfg=cfg, seed=3, out=b, block=2,
                          settings=settings)
    assert _json(again) == on_disk
    assert (b / "transcripts.jsonl").read_text() == (tmp_path / "a" / "transcripts.jsonl").read_text()
    assert len(s.calls[0][0]) == 2  # only block 1 (one problem x 2 runs) was simulated again
    r_full = results_from_records(_json(full), sampling, cfg, 3, 0.0)
    assert r_full == results_from_records(again, sampling, cfg, 3, 0.0)
    assert r_full["n_problems"] == 3 and r_full["n_conversations"] == 6
    assert r_full["correct"] == {n: sum(int(r["arms"][n]["correct"]) for r in on_disk) for n in r_full["arms"]}
    with pytest.raises(ValueError, match="seed=3, not 4"):  # another experiment in the same folder
        run_blocks(s, plan(DEFAULT_SOURCE, 3, 2), sampling, cfg=cfg, seed=4, out=b, block=2,
                   settings={**settings, "seed": 4})
    c = tmp_path / "c"  # a finished block whose records went missing (listed in blocks.jsonl) runs again
    shutil.copytree(tmp_path / "a", c)
    lines = (c / "transcripts.jsonl").read_text().splitlines()
    (c / "transcripts.jsonl").write_text("\n".join(lines[1:]) + "\n")
    s3 = _sampler(tiny_model)
    again3, _ = run_blocks(s3, plan(DEFAULT_SOURCE, 3, 2), sampling, cfg=cfg, seed=3, out=c, block=2,
                           settings=settings)
    assert _json(again3) == on_disk and len(s3.calls[0][0]) == 4  # block 0 (2 problems x 2 runs) again
    (b / "settings.json").unlink()  # an older evaluation's folder: its transcripts are not overwritten
    with pytest.raises(ValueError, match="without settings.json"):
        run_blocks(s, plan(DEFAULT_SOURCE, 3, 2), sampling, cfg=cfg, seed=3, out=b, block=2, settings=settings)
    assert (b / "transcripts.jsonl").read_text() == (tmp_path / "a" / "transcripts.jsonl").read_text()


def test_settings_with_tuples_resume_as_the_same_settings(tmp_path) -> None:
    """The stored settings.json turns tuples into lists: the check compares them as stored (a
    SeDTConfig's ``anchors`` and ``answer_formats`` are tuples of pairs)."""
    from jaxrl_mt.eval.sedt_files import check_settings as _check_settings

    settings = {"sedt_config": {"anchors": (("math", "Compute"),), "w_sem": 0.6}, "seed": 0}
    _check_settings(tmp_path, settings)
    _check_settings(tmp_path, settings)  # the same run again: no error
    with pytest.raises(ValueError, match=r"holds a run with seed=0, not 1"):
        _check_settings(tmp_path, {**settings, "seed": 1})
