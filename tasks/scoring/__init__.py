"""Scoring completions: chat rendering (chat), evaluation data formats (formats), pass@k and confidence intervals
(metrics) and the learning-curve plot (curves)."""
