"""The training scaffold the SFT and GRPO stages share: loading and training a policy (trainer), periodic
checkpoints and resume (checkpoints), the trainer callbacks (progress, health alarms, the held-out accuracy check),
and the tiny model of the CPU recipes (tiny_model)."""
