"""The pipeline's stages, flat, one module each, named after the stage; what stages share lives in subpackages by
role, never in another stage's module. Imports point down the list below: the stage modules import the
subpackages, release imports training, scoring and sources, training imports scoring, scoring imports sources, and
core imports only the config (pyproject.toml's import-linter contracts; `make lint`). Each stage is a plain
function usable without Prefect; the Prefect tasks that wrap them live in flows/stages.py.

    tasks/
      data.py        prepare_data: synthetic, file or Hub rows, split into train, eval and the probe split
      validate.py    validate_data: the data contract (columns, blanks, duplicates, overlap, lengths)
      model.py       base_model (prepare_base_model) and pin_registered (a registry alias -> one version)
      preflight.py   check_config and check_inputs: bad input caught before anything trains
      sft.py         sft_warmup (optionally until its probe reaches a bar)
      sft_check.py   check_sft: before GRPO, has SFT learned its data?
      difficulty.py  filter_by_difficulty: between GRPO rounds, the prompts the policy sometimes solves
      grpo.py        grpo_train: one GRPO round
      rft.py         rejection_sample: a staged recipe's rft stage, the policy's verified samples to fine-tune on
      evaluate.py    evaluate: a policy on the held-out split
      register.py    register_policy: the policy as a registered, gated MLflow model version
      decontaminate.py  decontaminate: training rows whose prompts overlap a benchmark's left out
      suites.py      prepare_suite: one evaluation suite's problems, loaded, mapped and validated
      sources/       where rows come from: the synthetic tasks, files and Hugging Face datasets, the data contract
      core/          stage keys and output folders, artifact references, MLflow runs, launches, publishing, Hub,
                     chat prompts, prompt lengths against the model's context, the process defaults
      training/      the trainer scaffold SFT and GRPO share, checkpoints, callbacks, the tiny model
      scoring/       generation, judging and scoring eval items, metrics, chat templates, benchmark formats
      release/       the promotion gate, registered versions, the logged model, model card, lineage
"""
