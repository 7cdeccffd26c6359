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


if __name__ == "__main__":
    main()
