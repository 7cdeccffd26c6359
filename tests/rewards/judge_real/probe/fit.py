"""Exploratory (session 7): a linear probe on the embedded model's hidden states as the answer-attempt judge.

    PYTHONPATH=. python tests/rewards/judge_real/probe/features.py /tmp/feats.npz \\
        tests/rewards/judge_real/{tune,heldout,heldout2,heldout3}.jsonl      # ~25 min of 2 CPU cores
    PYTHONPATH=. python tests/rewards/judge_real/probe/fit.py /tmp/feats.npz

Logistic regression (L2, strength chosen by 5-fold cross-validation by problem on the round-3
tuning files) on the final-norm hidden state at the generation point and the mean over the prompt,
for a prompt that shows the problem, the user's message and the reply and asks whether the reply
commits to one final number. Trained on the 785 replies of round 3, scored on heldout3 (320). The
result (docs/judge.md, round 4): no better than the rules, so it was not made a judge.
"""

import hashlib
import json
import sys

import numpy as np
from scipy.optimize import minimize

from jaxrl_mt.rewards.judge_rules import classify_rule_based

D = "tests/rewards/judge_real/"
FILES = ["tune.jsonl", "heldout.jsonl", "heldout2.jsonl", "heldout3.jsonl"]


def fit(X, y, lam):
    """Standardised L2 logistic regression; returns the scoring function."""
    mu, sd = X.mean(0), X.std(0) + 1e-6

    def design(A):
        return np.concatenate([(A - mu) / sd, np.ones((len(A), 1))], 1)

    Xs = design(X)

    def loss(w):
        s = Xs @ w
        p = 1 / (1 + np.exp(-s))
        g = Xs.T @ (p - y) / len(y) + lam * np.r_[w[:-1], 0]
        return (np.logaddexp(0, s) - y * s).mean() + 0.5 * lam * (w[:-1] ** 2).sum(), g

    w = minimize(loss, np.zeros(Xs.shape[1]), jac=True, method="L-BFGS-B", options={"maxiter": 500}).x
    return lambda A: design(A) @ w


def pr(y, p):
    tp = ((p == 1) & (y == 1)).sum()
    return round(tp / max(p.sum(), 1), 3), round(tp / y.sum(), 3)


def main(path):
    z = np.load(path)
    recs = [dict(json.loads(x), _file=f) for f in FILES for x in open(D + f) if x.strip()]
    assert [r["id"] for r in recs] == list(z["ids"])
    y = np.array([r["label"] == "answer_attempt" for r in recs], float)
    rules = np.array([classify_rule_based(r["text"], question=r.get("question"), user=r.get("user"))
                      == "answer_attempt" for r in recs], float)
    tr = np.array([r["_file"] != "heldout3.jsonl" for r in recs])
    te = ~tr
    groups = np.array([int(hashlib.sha256(r["task_id"].encode()).hexdigest(), 16) % 5 for r in recs])
    yn = z["yesno"][:, 0] - z["yesno"][:, 1]
    print("rules (current) on heldout3:", pr(y[te], rules[te]))
    print("zero-shot yes/no logit > 0 on heldout3:", pr(y[te], (yn[te] > 0).astype(float)))
    for kind, X in (("probe", z["feats"]), ("probe+rules", np.concatenate([z["feats"], rules[:, None] * 10], 1))):
        best = None
        for lam in [1e-3, 1e-2, 3e-2, 1e-1, 3e-1]:
            acc = []
            for g in range(5):
                m, v = tr & (groups != g), tr & (groups == g)
                acc.append(((fit(X[m], y[m], lam)(X[v]) > 0) == y[v]).mean())
            print(kind, "lam", lam, "cv acc", round(float(np.mean(acc)), 3))
            if best is None or np.mean(acc) > best[0]:
                best = (np.mean(acc), lam)
        s = fit(X[tr], y[tr], best[1])(X[te])
        print(kind, "lam*", best[1], "heldout3 P/R", pr(y[te], (s > 0).astype(float)),
              "acc", round(float(((s > 0) == y[te]).mean()), 3))


if __name__ == "__main__":
    main(sys.argv[1])
