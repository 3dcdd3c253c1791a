"""Tools and environments for GRPO over multi-turn tool use, on TRL's own agent API (docs/agents.md).

TRL 1.16's GRPOTrainer runs the loop: it renders the tools' JSON schemas into the prompt, parses each completion's
tool calls through the tokenizer's response template, calls the tools in the training process, appends their
results as `tool` messages and generates again, up to `max_tool_calling_iterations` times. This package supplies
what the pipeline adds around it:
  - built-in tools: `calculator` (exact arithmetic, parsed, never evaluated as code) and `python` (the model's code
    in the code reward's sandbox, with its isolation, time and output limits);
  - the registry: `grpo.tools` entries (built-in names or `pkg.module:function` paths) and `grpo.environment` (a
    class by dotted path) resolved and checked, with errors that name the field and the fix; user tools are wrapped
    so that one that raises, hangs or floods gives the model a message within limits instead of stalling training;
  - the trainer's arguments: `agent_args(cfg)` for GRPOConfig, `trainer_agent_kwargs(cfg, tokenizer)` for
    GRPOTrainer;
  - the one episode loop (`episodes.run_episodes`) that the text rollout, evaluation, the probes, the difficulty
    filter and the demonstrations run, in text (`text_tools`) or through the chat template as TRL's own loop does
    (`chat_tools`), and one definition of a failed tool call for training and evaluation (`failure`).

    agents/
      calculator.py     the `calculator` tool: exact arithmetic, parsed with `ast`, never evaluated
      python_tool.py    the `python` tool: the model's code in the code reward's sandbox
      registry.py       `grpo.tools` and `grpo.environment` resolved and checked; user tools wrapped in limits
      trainer_args.py   what a GRPO round hands TRL for tool use (GRPOConfig fields, GRPOTrainer arguments)
      failure.py        a failed tool call (ToolFailure), counted as TRL counts it, in training and evaluation
      episodes.py       the one episode loop (`run_episodes`) and what an episode is
      text_tools.py     tool calls written as plain text, for a model whose chat template cannot carry them
      chat_tools.py     tool calls through the chat template, as TRL's own loop makes them
      loops.py          which of the two a model runs tools in (`eval_tool_loop`)
      demonstration.py  a tool episode whose first turn is a scripted call (`grpo-pipeline rehearse`)

Threat model, in short: a tool's arguments are written by the policy, which is rewarded for whatever works, so they
are hostile input. The calculator never evaluates text; the python tool runs code only inside the sandbox; user tools
run in the training process (they are the user's own code, trusted as user rewards are) under a time and size limit.
"""
