"""Scoring completions: what the evaluate stage, the difficulty filter, the probe and the gate share.

scoring/
  evaluation.py  evaluate_model: generate greedy and sampled completions, score every item, write the items
  results.py     EvalResult: the scores and what reproduces them; items summarized, unscored shares checked
  generation.py  batched generation with the completions' token ids
  episodes.py    tool episodes of the one episode loop, behind generation's contract
  rollouts.py    a policy sampled as a GRPO round samples it, each sample judged (difficulty filter, rft)
  items.py       each item judged by the correctness reward: pass@k, maj@k, rewards, unscored reasons
  metrics.py     pass@k, maj@k, bootstrap confidence intervals
  formats.py     benchmark formats: detection, correctness reward, loading
  adapters.py    each format's rows mapped to the eval columns
  curves.py      the GRPO learning-curve plot, the rounds' and the stage matrix's plots
  matrix.py      a staged run's stage x suite matrix: its rows and its table (run summary, model card)
  tool_use.py    a tool-using policy's episodes in words and tables (run summary, model card)
  vllm_generation.py  evaluation's completions through vLLM
  vllm_episodes.py    tool episodes through vLLM
"""
