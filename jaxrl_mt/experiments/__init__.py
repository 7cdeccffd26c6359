"""The RLSTA CPU experiment (issue 15): calibration, held-out set, model comparison and its report.

Entry points (each ``python -m jaxrl_mt.experiments.<name> --help``):

  calibrate  single- vs multi-turn strict accuracy of candidate problem families (base model)
  heldout    builds the held-out multi-turn evaluation set (templates kept out of training)
  compare    evaluates models on the held-out set and writes the report with plots

Library modules:

  analysis   pure functions of transcript records: accuracies, paired bootstrap, inertia, types
  plots      the report's PNG figures
  report     the report (JSON + markdown) from the files ``compare`` writes; ``--recompute``

This package sits above the engine and methods (it imports ``jaxrl_mt.evaluate`` and the RL
loop's public names); nothing below imports it.
"""
