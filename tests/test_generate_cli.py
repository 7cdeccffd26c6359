"""`python -m jaxrl_mt.generate`: outputs equal the library's, prompts-file validation, exit codes.

Most tests run `main(argv)` in-process on a tiny random model that carries the embedded model's
tokenizer and chat template (fast to compile); one slow test runs the real CLI on the embedded model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.generate import main
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.hf_io import export_hf_folder
from jaxrl_mt.models.registry import DEFAULT_MODEL, load_model, load_tokenizer, resolve
from jaxrl_mt.sampling import Sampler, SamplingConfig
from tests.test_sampling import numpy_params

CONTEXT = 96


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """A tiny random model (context 96) saved with the embedded model's tokenizer."""
    tok = load_tokenizer(resolve(DEFAULT_MODEL))
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, tie_word_embeddings=True, max_position_embeddings=CONTEXT,
                      eos_token_id=(2,), bos_token_id=1, pad_token_id=2)
    return export_hf_folder(cfg, numpy_params(cfg, 0, scale=0.5),
                            tmp_path_factory.mktemp("cli") / "tiny", tokenizer=tok)


@pytest.fixture(scope="module")
def tiny(tiny_folder):
    return load_model(str(tiny_folder))


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def test_json_output_equals_the_sampler(capsys, tiny_folder, tiny, tmp_path):
    f = tmp_path / "p.jsonl"
    convs = [[{"role": "user", "content": "Hi"}],
             [{"role": "user", "content": "I have 3 apples."}, {"role": "assistant", "content": "Okay."},
              {"role": "user", "content": "And now?"}]]
    f.write_text(json.dumps({"prompt": "Hi"}) + "\n\n" + json.dumps({"messages": convs[1]}) + "\n")
    rc, out, err = run_cli(capsys, "--model", str(tiny_folder), "--prompts-file", str(f), "--max-new-tokens", "7",
                           "--temperature", "0.9", "--top-p", "0.8", "--seed", "3", "--json", "--system", "Be brief.")
    assert rc == 0, err
    recs = json_lines(out)
    expected = Sampler.from_model(tiny).generate(convs, SamplingConfig(7, 0.9, 0, 0.8), seed=3, system="Be brief.")
    assert [r["source"] for r in recs] == [f"{f}:1", f"{f}:3"]
    assert [r["index"] for r in recs] == [0, 1]
    assert [r["tokens"] for r in recs] == expected.tokens
    assert [r["text"] for r in recs] == expected.texts
    assert [r["finish_reason"] for r in recs] == expected.finish_reasons
    for r, lp in zip(recs, expected.logprobs):
        assert r["logprobs"] == pytest.approx(lp.tolist(), abs=1e-7)
        assert 1 <= len(r["tokens"]) <= 7 and all(x <= 0 for x in r["logprobs"])
    assert "2 prompts" in err


def test_system_message_reaches_the_template(capsys, tiny_folder, tiny):
    conv = [{"role": "user", "content": "Hi"}]
    with_sys = encode_prompt(tiny.tokenizer, conv, system="Answer in French.")
    without = encode_prompt(tiny.tokenizer, conv)
    assert with_sys != without
    base = ("--model", str(tiny_folder), "--prompt", "Hi", "--max-new-tokens", "6", "--json")
    _, out_sys, _ = run_cli(capsys, *base, "--system", "Answer in French.")
    _, out_plain, _ = run_cli(capsys, *base)
    sampler = Sampler.from_model(tiny)
    cfg = SamplingConfig(6, 0.0)
    assert json_lines(out_sys)[0]["tokens"] == sampler.generate_ids([with_sys], cfg).tokens[0]
    assert json_lines(out_plain)[0]["tokens"] == sampler.generate_ids([without], cfg).tokens[0]


def test_text_blocks_one_per_prompt(capsys, tiny_folder, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": p}) for p in ("a", "b c", "d e f")) + "\n")
    rc, out, err = run_cli(capsys, "--model", str(tiny_folder), "--prompts-file", str(f), "--max-new-tokens", "4",
                           "--batch-size", "2")
    assert rc == 0, err
    headers = [line for line in out.splitlines() if line.startswith("--- [")]
    assert [h.split(" (")[0] for h in headers] == [f"--- [{i}] {f}:{i + 1}" for i in range(3)]


def test_batch_size_does_not_change_greedy_outputs(capsys, tiny_folder, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": "word " * n}) for n in (1, 5, 9, 2, 7)) + "\n")
    base = ("--model", str(tiny_folder), "--prompts-file", str(f), "--max-new-tokens", "6", "--json")
    _, ones, _ = run_cli(capsys, *base, "--batch-size", "1")
    _, twos, _ = run_cli(capsys, *base, "--batch-size", "2")
    assert [r["tokens"] for r in json_lines(ones)] == [r["tokens"] for r in json_lines(twos)]


def test_seed_controls_sampling(capsys, tiny_folder, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "Tell me a story"}) + "\n" + json.dumps({"prompt": "Go on"}) + "\n")
    base = ("--model", str(tiny_folder), "--prompts-file", str(f), "--max-new-tokens", "12",
            "--temperature", "1.0", "--top-p", "0.95", "--json")
    runs = [[r["tokens"] for r in json_lines(run_cli(capsys, *base, "--seed", s)[1])] for s in ("5", "5", "6")]
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[2][0] and runs[0][1] != runs[2][1]


def lines_of(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


@pytest.mark.parametrize("argv, message", [
    (["--prompt", ""], "error: --prompt: empty prompt"),
    (["--prompt", "  \n "], "error: --prompt: empty prompt"),
    (["--prompt", "hi", "--max-new-tokens", "0"], "error: --max-new-tokens must be > 0, got 0"),
    (["--prompt", "hi", "--max-new-tokens", "-4"], "error: --max-new-tokens must be > 0, got -4"),
    (["--prompt", "hi", "--max-new-tokens", "x"], "error: argument --max-new-tokens: invalid int value: 'x'"),
    (["--prompt", "hi", "--temperature", "-1"], "error: --temperature must be >= 0, got -1.0"),
    (["--prompt", "hi", "--top-p", "0"], "error: --top-p must be in (0, 1], got 0.0"),
    (["--prompt", "hi", "--top-k", "-1"], "error: --top-k must be >= 0, got -1"),
    (["--prompt", "hi", "--batch-size", "0"], "error: --batch-size must be > 0, got 0"),
    ([], "error: one of the arguments --prompt --prompts-file is required"),
    (["--prompt", "hi", "--prompts-file", "x.jsonl"],
     "error: argument --prompts-file: not allowed with argument --prompt"),
    (["--prompt", "hi", "--model", "builtin:nope"], "error: --model: unknown builtin model 'nope'"),
    (["--prompt", "hi", "--model", "/no/such/folder"], "error: --model: unknown model '/no/such/folder'"),
])
def test_bad_arguments_exit_2_with_one_line(capsys, argv, message):
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2
    assert out == ""
    assert len(lines_of(err)) == 1 and err.startswith(message), err


def test_prompt_longer_than_the_context(capsys, tiny_folder, tiny):
    prompt = "many words " * 60
    n = len(encode_prompt(tiny.tokenizer, [{"role": "user", "content": prompt}]))
    assert n > CONTEXT
    rc, out, err = run_cli(capsys, "--model", str(tiny_folder), "--prompt", prompt, "--max-new-tokens", "4")
    assert rc == 2 and out == ""
    assert lines_of(err) == [f"error: --prompt: prompt of {n} tokens + 4 new tokens exceeds the model context "
                             f"({CONTEXT} tokens)"]
    # a prompt that fits alone but not with its new tokens is refused too
    short = len(encode_prompt(tiny.tokenizer, [{"role": "user", "content": "Hi"}]))
    rc, _, err = run_cli(capsys, "--model", str(tiny_folder), "--prompt", "Hi", "--max-new-tokens",
                         str(CONTEXT - short + 1))
    assert rc == 2 and f"prompt of {short} tokens + {CONTEXT - short + 1} new tokens exceeds" in err


BAD_LINES = [
    ('{"prompt": "ok"}\n{"prompt": "x"', ":2: invalid JSON (Expecting ',' delimiter at column 15)"),
    ('[1, 2]', ":1: expected a JSON object, got list"),
    ('{"prompt": 3}', ":1:prompt: expected a string, got int"),
    ('{"prompt": "  "}', ":1:prompt: empty prompt"),
    ('{"text": "x"}', ":1:text: unknown field; expected 'prompt' or 'messages'"),
    ('{"prompt": "a", "messages": []}', ":1: expected exactly one of the fields 'prompt' and 'messages'"),
    ('{}', ":1: expected exactly one of the fields 'prompt' and 'messages'"),
    ('{"messages": "hi"}', ":1:messages: expected a list of messages, got str"),
    ('{"messages": []}', ":1:messages: empty prompt (no messages)"),
    ('{"prompt": "ok"}\n{"messages": [{"role": "bot", "content": "x"}]}',
     ":2:messages[0].role: unknown role 'bot'; expected one of system, user, assistant"),
    ('{"messages": [{"role": "user"}]}', ":1:messages[0].content: missing"),
    ('{"messages": [{"content": "x"}]}', ":1:messages[0].role: missing"),
    ('{"messages": [{"role": "user", "content": ["x"]}]}', ":1:messages[0].content: expected a string, got list"),
    ('{"messages": [{"role": "user", "content": "x", "name": "n"}]}', ":1:messages[0].name: unknown field"),
    ('{"messages": ["hi"]}', ":1:messages[0]: expected an object with 'role' and 'content', got str"),
    ('{"messages": [{"role": "system", "content": "x"}]}', ":1:messages: no user or assistant message"),
    ('{"messages": [{"role": "user", "content": " "}]}',
     ":1:messages: empty prompt (every user/assistant content is blank)"),
]


@pytest.mark.parametrize("text, suffix", BAD_LINES)
def test_bad_prompts_file_names_file_line_field(capsys, tmp_path, text, suffix):
    f = tmp_path / "prompts.jsonl"
    f.write_text(text + "\n")
    rc, out, err = run_cli(capsys, "--prompts-file", str(f), "--model", "builtin:never-loaded")
    assert rc == 2 and out == ""
    assert lines_of(err) == [f"error: {f}{suffix}"]


def test_missing_and_empty_prompts_files(capsys, tmp_path):
    missing = tmp_path / "none.jsonl"
    rc, _, err = run_cli(capsys, "--prompts-file", str(missing))
    assert rc == 2 and err.startswith(f"error: {missing}: cannot read prompts file (FileNotFoundError")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    rc, _, err = run_cli(capsys, "--prompts-file", str(empty))
    assert rc == 2 and lines_of(err) == [f"error: {empty}: no prompts"]


@pytest.mark.slow
def test_module_entry_point_on_the_embedded_model(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "jaxrl_mt.generate", "--prompt", "What is 2+2?",
                           "--max-new-tokens", "32", "--json"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr
    (rec,) = json_lines(proc.stdout)
    assert rec["finish_reason"] == "stop" and rec["tokens"][-1] == 2  # <|im_end|>
    assert "4" in rec["text"]


def test_non_utf8_prompts_file_names_file_and_line(capsys, tmp_path):
    f = tmp_path / "latin1.jsonl"
    f.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')  # Latin-1, not UTF-8
    rc, out, err = run_cli(capsys, "--prompts-file", str(f), "--model", "builtin:never-loaded")
    assert rc == 2 and out == ""
    assert lines_of(err) == [f"error: {f}:2: not UTF-8 text (byte 0xe9 at column 16); save the prompts file as UTF-8"]
