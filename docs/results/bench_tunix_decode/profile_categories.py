"""Op time of one traced greedy call (jax.profiler perfetto trace) by category.

    python profile_categories.py TRACE_DIR TOKENS

Durations of XLA:CPU thunk events summed over threads (work run on both cores in parallel counts twice,
so the total can exceed the wall time); per-token figures divide by the call's TOKENS (prefill included).
"""
import gzip, json, sys, collections, glob
f = glob.glob(sys.argv[1] + "/plugins/profile/*/perfetto_trace.json.gz")[0]
steps = int(sys.argv[2])
d = json.load(gzip.open(f)); ev = d["traceEvents"] if isinstance(d, dict) else d
cat = collections.Counter(); n = collections.Counter()
for e in ev:
    if e.get("ph") != "X": continue
    nm = e["name"]
    if nm.startswith("$") or nm.startswith("ThunkExecutor") or "Pjit" in nm or nm.startswith("np.") or "Await" in nm or nm.startswith("while"): continue
    if nm.startswith("ynn_fusion"): c = "ynn (matmul fusions)"
    elif nm.startswith("dot"): c = "dot (Eigen)"
    elif "dynamic-slice" in nm: c = "dynamic-slice copies"
    elif "reduce-window" in nm or "broadcast_multiply" in nm: c = "attention mult-reduce"
    else: c = "other fusions"
    cat[c] += e.get("dur", 0); n[c] += 1
tot = sum(cat.values())
for c, t in cat.most_common(): print(f"{c:28s} {t/1000:8.1f} ms total, {t/1000/steps:6.2f} ms/token, {n[c]/steps:6.1f} events/token, {100*t/tot:4.1f}%")
print(f"{'all ops':28s} {tot/1000:8.1f} ms, {tot/1000/steps:.2f} ms/token")
