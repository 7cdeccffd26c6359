"""report.html: a self-contained page, opened in headless Chromium (the OS package).

The page comes from a real evaluation (``evaluate`` with a scripted OpenAI-compatible assistant
on 127.0.0.1, so it runs in seconds without a model): the test checks the metrics table, that
every conversation is there, that filters preset in the URL fragment change what is shown, that
message text cannot inject markup, and keeps a screenshot (in the pytest tmp dir, and copied to
``$JAXRL_MT_ARTIFACTS`` when that is set).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

from jaxrl_mt.eval.html_report import html_report
from jaxrl_mt.eval.simulator import plan_runs
from jaxrl_mt.evaluate import evaluate, load_tasks
from tests.eval.test_evaluate_cli import read_transcripts, tiny_config
from tests.test_backends import FakeOpenAIServer

SCENARIOS = ("full", "sharded", "recap")
DATASET = ("synthetic:2", "lic:@")
INJECTION = "<img id=pwned src=x onerror=\"document.title='pwned'\"></script><b id=bold>x</b>"


def browser() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("chromium is not installed (.ci/run installs the Debian package)")
    return path


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """An evaluation whose assistant answers some conversations right, some wrong, some never."""
    out = tmp_path_factory.mktemp("html_eval")
    runs, _ = plan_runs(load_tasks(DATASET, limit=2), SCENARIOS, 2)
    gold = {r.user_turns[0]: r.meta["answer"] for r in runs}

    def script(number, body):
        users = [m["content"] for m in body["messages"] if m["role"] == "user"]
        h = zlib.crc32(users[0].encode()) + len(users)
        if len(users) == 1 and h % 4 == 0:
            text = INJECTION
        elif h % 3 == 0:
            text = f"Putting it all together, the answer is {gold[users[0]]}."
        elif h % 3 == 1:
            text = "I think the answer is 7."
        else:
            text = "Could you tell me the rest of the problem?"
        return 200, {}, {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 30, "completion_tokens": 9}}

    server = FakeOpenAIServer(script)
    try:
        evaluate(tiny_config(out, model=f"http:{server.url}#scripted", dataset=DATASET, limit=2, scenarios=SCENARIOS,
                             temperature=0.0, plots=True, bootstrap=200), log=lambda s: None)
    finally:
        server.close()
    return out


def chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    cmd = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           f"--user-data-dir={tmp / 'chromium-profile'}", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def dump(page: Path, fragment: str, tmp: Path) -> str:
    return chromium("--dump-dom", page.as_uri() + fragment, tmp=tmp).stdout


def shown(dom: str) -> list[str]:
    return re.findall(r'<details class="conv score[01]"[^>]*data-conv-id="([^"]+)"', dom)


def test_page_is_self_contained_and_embeds_every_record(workdir):
    page = (workdir / "report.html").read_text()
    records = read_transcripts(workdir / "transcripts.jsonl")
    assert not re.search(r'(src|href)="(?!data:)', page)  # nothing fetched at view time
    assert len(re.findall(r'src="data:image/png;base64,', page)) == 3
    for b64 in re.findall(r'src="data:image/png;base64,([^"]+)"', page):
        assert base64.b64decode(b64)[:8] == b"\x89PNG\r\n\x1a\n"
    blob = re.search(r'<script type="application/json" id="lic-data">(.*?)</script>', page, re.S).group(1)
    data = json.loads(blob)
    assert sorted(r["conv_id"] for r in data["records"]) == sorted(r["conv_id"] for r in records)
    assert "</script><b" not in blob  # escaped in the page...
    assert any(t["assistant"] == INJECTION for r in data["records"] for t in r["turns"])  # ...intact as data
    report = json.loads((workdir / "report.json").read_text())
    assert html_report(report, records, []).count('<tr data-scenario="') == len(SCENARIOS)


def test_page_in_headless_chromium_filters_and_screenshot(workdir, tmp_path):
    page = workdir / "report.html"
    records = read_transcripts(workdir / "transcripts.jsonl")
    report = json.loads((workdir / "report.json").read_text())
    assert {r["score"] for r in records} == {0.0, 1.0}

    dom = dump(page, "", tmp_path)
    table = re.search(r'<table class="metrics" id="metrics">(.*?)</table>', dom, re.S).group(1)
    assert re.findall(r'<tr data-scenario="(\w+)">', table) == list(SCENARIOS)
    for kind, s in report["scenarios"].items():
        lo, hi = s["ci"]["P"]
        assert (f'<td>{kind}</td><td>{s["n_instructions"]}</td><td>{s["n_runs"]}</td><td>{s["P"]:.1f} '
                f'<span class="ci">[{lo:.1f}, {hi:.1f}]</span></td>') in table
    assert sorted(shown(dom)) == sorted(r["conv_id"] for r in records)
    assert f"showing {len(records)} of {len(records)} matching" in dom
    assert 'id="pwned"' not in dom and 'id="bold"' not in dom and "&lt;img id=pwned" in dom

    want = sorted(r["conv_id"] for r in records if r["kind"] == "sharded" and r["score"] == 1)
    dom = dump(page, "#scenario=sharded&score=1", tmp_path)
    assert 0 < len(want) < len(records) and sorted(shown(dom)) == want
    assert f"showing {len(want)} of {len(want)} matching conversations ({len(records)} in all)" in dom

    shot = tmp_path / "report_html.png"
    chromium(f"--screenshot={shot}", "--window-size=1280,1900", page.as_uri() + "#scenario=sharded&open=first",
             tmp=tmp_path)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
    if os.environ.get("JAXRL_MT_ARTIFACTS"):
        dest = Path(os.environ["JAXRL_MT_ARTIFACTS"])
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, dest / shot.name)
