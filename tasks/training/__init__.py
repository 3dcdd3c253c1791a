"""The training scaffold the SFT and GRPO stages share, and its trainer callbacks.

training/
  trainer.py      train_policy: one MLflow run, resume, an atomic save; model loading and TRL arguments
  checkpoints.py  periodic resumable checkpoints, sealed when complete
  checkpoint_mirror.py  those checkpoints mirrored to MLflow, for Ray workers that share no disk
  progress.py     per training stage: its console progress line and a Prefect progress artifact
  health.py       a GRPO round's health watch and its trainer callback
  monitor.py      the alarm logic itself (readings in, alarms out)
  probe.py        the held-out accuracy probe: greedy accuracy during GRPO, the kept step, SFT's bar
  keep_rule.py    the statistics of the keep decision (grpo.keep_over_start), pure
  consensus.py    one decision for every process of a multi-process stage (gather, agree)
  tiny_model.py   the char-level tiny model of the CPU recipes
  family_model.py a tiny local stand-in for a hub model of the same family (`grpo-pipeline rehearse`)
  vllm_rollouts.py  GRPO rollouts through vLLM: where they can run, weight sync on CPU
"""
