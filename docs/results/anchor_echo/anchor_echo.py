"""Why the merged anchor taught the model to repeat the user (issue 15, docs/results/experiment.md, Ablations).

R_s (the reference = the embedded base model; `rewards.anchor.anchor_reward`, as in training) of four replies
to every 8th MT-Add and MT-Refine held-out conversation (40 each), scored under the merged user turns (joined
with newlines, as `rl.histories` builds `merged_user`) and under the clean full prompt: the merged-anchor
run's final reply, the full-anchor run's (rlsta_exp) final reply, the last user turn copied verbatim, and
"The answer is <gold>.". Reads the committed greedy transcripts in docs/results/rlsta_cpu/models/.
Run from the repository root: python docs/results/anchor_echo/anchor_echo.py (output: anchor_echo.txt)."""
import gzip
import json

from jaxrl_mt.models.registry import load_model
from jaxrl_mt.rewards.anchor import anchor_reward
from jaxrl_mt.scoring import Scorer

MODELS = "docs/results/rlsta_cpu/models"


def load(name: str) -> list[dict]:
    with gzip.open(f"{MODELS}/{name}/greedy/transcripts.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


merged_run, full_run = load("rlsta_merged"), {r["conv_id"]: r for r in load("rlsta_exp")}
full_prompt = {r["task_id"]: r["turns"][0]["user"] for r in load("base") if r["kind"] == "full"}
model = load_model("builtin:smollm2-135m-instruct")
tok = model.tokenizer
scorer = Scorer(model.params, model.cfg, pad_id=tok.pad_token_id or 0, batch_size=16)
for kind in ("sharded", "mt_refine"):
    rows = [r for r in merged_run if r["kind"] == kind][::8]  # 40 conversations
    contexts = {"merged": ["\n".join(t["user"] for t in r["turns"]) for r in rows],
                "full": [full_prompt[r["task_id"]] for r in rows]}
    replies = {"rlsta_merged final reply": [r["turns"][-1]["assistant"] for r in rows],
               "rlsta_exp final reply": [full_run[r["conv_id"]]["turns"][-1]["assistant"] for r in rows],
               "last user turn, verbatim": [r["turns"][-1]["user"] for r in rows],
               'gold, "The answer is N."': [f"The answer is {r['gold']}." for r in rows]}
    for name, texts in replies.items():
        ids = [tok.encode(x, add_special_tokens=False) for x in texts]
        r_s = {c: anchor_reward(scorer, tok, prompts, ids).mean() for c, prompts in contexts.items()}
        print(f"{kind:9s} {name:28s} n={len(rows)}  R_s merged {r_s['merged']:.3f}  full {r_s['full']:.3f}",
              flush=True)
