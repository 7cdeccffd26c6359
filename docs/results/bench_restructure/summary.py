"""Medians of the pre/post-restructure engine benchmarks (issue 17) in this folder."""

import glob
import json
import os
import statistics as st

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    for mode in ("sampling", "scoring"):
        for side in ("old", "new"):
            d = [json.load(open(f)) for f in sorted(glob.glob(f"{HERE}/{side}_{mode}_*.json"))]
            if not d:
                continue
            r = [x["ratio_tokens_per_s"] for x in d]
            med = {k: st.median(x[k]["tokens_per_s"] for x in d) for k in ("ours", "transformers")}
            line = (f"{mode:8s} {side}: n={len(d)} ratio median {st.median(r):.3f} {['%.3f' % v for v in r]} "
                    f"ours {med['ours']:.1f} tok/s, transformers {med['transformers']:.1f} tok/s, "
                    f"bandwidth {st.median(x['bandwidth_gb_s'] for x in d):.1f} GB/s")
            if mode == "sampling":
                line += (f", roofline (ours) {st.median(x['ours']['roofline_fraction'] for x in d):.3f}, "
                         f"greedy rows identical {[x['agree_rows'] for x in d]}")
            else:
                line += f", max |logprob diff| {max(x['max_abs_logprob_diff'] for x in d):.2e}"
            print(line)

    for side in ("old", "new"):  # run_grpo_sim.sh: the GRPO step against TRL
        path = f"{HERE}/grpo_{side}.json"
        if os.path.isfile(path):
            r = json.load(open(path))["results"]
            o, t = r["ours"], r["trl"]
            ph = " ".join(f"{k} {v:.1f}" for k, v in o["phases_steady_s"].items())
            print(f"grpo     {side}: steady step ours {o['steady_step_s']:.2f} s ({ph}), "
                  f"TRL {t['steady_step_s']:.2f} s -> TRL / ours {t['steady_step_s'] / o['steady_step_s']:.2f}x; "
                  "peak RSS ours "
                  f"{o['peak_rss_mb'] / 1024:.2f} GB, TRL {t['peak_rss_mb'] / 1024:.2f} GB")
    for side in ("old", "new"):  # run_grpo_sim.sh: the LiC simulator against plain batched generation
        ratios = []
        for f in sorted(glob.glob(f"{HERE}/sim_{side}_*.txt")):
            line = [x for x in open(f).read().splitlines() if x.startswith("ratio simulator / plain:")]
            if line:
                ratios.append(float(line[-1].split(":")[1]))
        if ratios:
            print(f"simulator {side}: n={len(ratios)} ratio simulator / plain median {st.median(ratios):.3f} "
                  f"{['%.2f' % v for v in ratios]}")


if __name__ == "__main__":
    main()
