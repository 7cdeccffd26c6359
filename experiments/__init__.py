"""The RLSTA CPU experiment (issue 15): calibration, held-out set, model comparison and its report.

Entry points (each ``python -m experiments.<name> --help``):

  calibrate  single- vs multi-turn strict accuracy of candidate problem families (base model)
  heldout    builds the held-out multi-turn evaluation set (templates kept out of training)
  train_arm  runs one training arm and records its wall time, peak memory and machine load
  compare    evaluates models on the held-out set and writes the report with plots

Library modules:

  analysis   pure functions of transcript records: accuracies, paired bootstrap, inertia, types
  report     the report dict from the files ``compare`` writes (``compare --recompute``)
  markdown   the report as markdown
  plots      the report's PNG figures
  common     the evaluation config, reading (gzipped) transcripts, JSON output

This package sits above the engine and methods (it imports ``jaxrl_mt.evaluate`` and the RL
loop's public names); nothing below imports it.
"""
