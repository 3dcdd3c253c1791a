"""Releasing a model: what the register stage and `grpo-pipeline eval` share.

release/
  gate.py          champion or challenger: the paired comparison with the current champion
  champion.py      the current champion and its per-item scores, read from MLflow (or scored again)
  versions.py      registered versions: pending, finished, re-gated after an interruption
  logged_model.py  the policy as an MLflow transformers model, its requirements, the completions table
  card.py          the model card
  lineage.py       provenance tags: eval settings, code version, library versions
  registered.py    a registered version resolved from its models:/ URI and downloaded as a Hugging Face directory
"""
