"""The `data:` section: where the problems come from (a built-in synthetic task, a file, a Hugging Face
dataset), how each row becomes a prompt, and the train/eval split."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from grpo_pipeline.configs.base import Section

FUNCTION_FAMILIES = ("x+k", "x-k", "k-x", "x*k", "max(x,k)")


class SyntheticTaskConfig(Section):
    kind: Literal["arithmetic", "functions", "tool_arithmetic"] = Field(
        default="arithmetic",
        description="'arithmetic': '47+38=' -> '85' (operations, min/max_digits). 'functions': write a Python "
        "function's body from input/output examples, '#f(0)=3 f(1)=4 f(7)=10\\ndef f(x):return ' -> 'x+3', each "
        "row carrying HumanEval-style hidden unit tests (`test`, `entry_point`) on inputs the examples do not show; "
        "score it with the code_tests reward (families, max_constant, num_tests, teacher_order_slip). "
        "'tool_arithmetic': additions whose SFT demonstrations call the calculator in text, imperfectly "
        "('4821+9097=' -> '<<4821+9097=13918>>13918'; tasks/sources/tool_tasks.py); for grpo.tools: [calculator].",
    )
    operations: list[Literal["+", "-", "*"]] = Field(
        default=["+"], description="Operators drawn uniformly for each problem."
    )
    min_digits: int = Field(default=1, ge=1, le=6, description="Fewest digits per operand.")
    max_digits: int = Field(default=2, ge=1, le=6, description="Most digits per operand.")
    teacher_carry_slip: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Imperfect SFT demonstrations: the fraction of training '+' problems that need a carry whose "
        "SFT completion forgets it (47+38= -> 75 instead of 85). Only the SFT target changes; the answer that "
        "rewards and evaluation check is always right. 0 = a perfect teacher.",
    )
    teacher_slip_carries: Literal["units", "all"] = Field(
        default="units",
        description="Which carries the imperfect teacher (teacher_carry_slip) forgets: 'units', the carry out of the "
        "units digit (47+38= -> 75); 'all', every carry, adding column by column mod 10 (75+48= -> 13), on the "
        "problems that need any.",
    )
    units_drill: int = Field(
        default=0,
        ge=0,
        le=100,
        description="A units-table drill for SFT: this many copies of the 100 one-digit additions, written at the "
        "task's width ('07+08=' -> '15' with 2-digit operands, so the digits sit where a real problem's units digits "
        "do), added to the SFT data only (GRPO, evaluation and the probe never see them). The table of units digits "
        "is what SFT learns last, after a plateau whose length depends on the seed; drilling it directly takes "
        "every seed off the plateau (benchmarks/LEARNING.md). 0 = no drill.",
    )
    families: list[Literal["x+k", "x-k", "k-x", "x*k", "max(x,k)"]] = Field(
        default=list(FUNCTION_FAMILIES),
        min_length=1,
        description="kind 'functions': the function families drawn uniformly for each problem (k is the constant).",
    )
    max_constant: int = Field(
        default=49, ge=2, le=999, description="kind 'functions': the constant k is drawn from 1..max_constant."
    )
    num_tests: int = Field(
        default=5, ge=1, le=20, description="kind 'functions': hidden asserts per row, on inputs not in the prompt."
    )
    teacher_order_slip: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="kind 'functions', imperfect SFT demonstrations: the fraction of training k-x problems whose "
        "SFT completion swaps the operands (12-x written x-12). Only the SFT target changes; the hidden tests that "
        "rewards and evaluation run are always right. 0 = a perfect teacher.",
    )

    @model_validator(mode="after")
    def _digits_ordered(self) -> SyntheticTaskConfig:
        if self.min_digits > self.max_digits:
            raise ValueError(
                f"min_digits ({self.min_digits}) is larger than max_digits ({self.max_digits}); lower min_digits"
            )
        if self.teacher_carry_slip > 0 and "+" not in self.operations:
            raise ValueError("teacher_carry_slip only changes '+' problems; add '+' to operations or set it to 0")
        if self.teacher_carry_slip > 0 and self.kind != "arithmetic":
            raise ValueError("teacher_carry_slip only changes kind 'arithmetic'; use teacher_order_slip or set it to 0")
        if self.units_drill and (self.kind != "arithmetic" or "+" not in self.operations):
            raise ValueError("units_drill drills one-digit additions; use kind 'arithmetic' with '+' or set it to 0")
        if self.teacher_order_slip > 0 and self.kind != "functions":
            raise ValueError("teacher_order_slip only changes kind 'functions'; set kind: functions or set it to 0")
        if self.teacher_order_slip > 0 and "k-x" not in self.families:
            raise ValueError("teacher_order_slip only changes k-x problems; add k-x to families or set it to 0")
        return self


class DataConfig(Section):
    source: Literal["synthetic", "file", "hf"] = Field(
        default="synthetic",
        description="'synthetic': a built-in task (data.synthetic.kind); 'file': a local JSONL/Parquet/CSV file "
        "(`path`); 'hf': a Hugging Face dataset by name (`hf_name`).",
    )
    synthetic: SyntheticTaskConfig = Field(default_factory=SyntheticTaskConfig)
    path: str | None = Field(default=None, description="Local .jsonl/.json/.parquet/.csv file (source: file).")
    hf_name: str | None = Field(default=None, description="Dataset name or local dataset directory (source: hf).")
    hf_config: str | None = Field(default=None, description="Dataset configuration name (source: hf).")
    hf_split: str = Field(default="train", description="Split to load (source: hf).")
    prompt_column: str = Field(default="prompt", description="Source column that holds the question.")
    answer_column: str = Field(default="answer", description="Source column that holds the reference answer.")
    completion_column: str | None = Field(
        default=None,
        description="Source column with a full target completion for SFT (e.g. worked solutions); "
        "the answer is used when unset.",
    )
    extra_columns: list[str] = Field(
        default=[], description="Further source columns kept for rewards (e.g. test, entry_point)."
    )
    prompt_template: str = Field(
        default="{prompt}", description="Python format string applied to each row; `{prompt}` is the question."
    )
    prompt_format: Literal["text", "chat"] = Field(
        default="text",
        description="'text': each prompt is the templated question, fed to the model as it is. 'chat': each prompt "
        "becomes chat messages (the system prompt when set, then the templated question as the user's message; a "
        "source column that already holds messages is kept), rendered with the tokenizer's chat template for SFT, "
        "GRPO and evaluation alike (tasks/core/chat.py).",
    )
    system_prompt: str | None = Field(
        default=None,
        min_length=1,
        description="System message put before every chat prompt (prompt_format: chat); none when unset.",
    )
    answer_pattern: str | None = Field(
        default=None,
        description="Regex with one group that extracts the final answer from the answer column "
        "(e.g. '#### (.+)$' for GSM8K); the whole value is used when unset.",
    )
    num_train: int = Field(default=4000, ge=1, description="Training problems (rows) after the split.")
    num_eval: int = Field(default=500, ge=1, description="Held-out problems (rows) for evaluation.")
    num_probe: int = Field(
        default=128,
        ge=0,
        description="Held-out problems (rows) for the GRPO probe (grpo.probe_problems, grpo.keep: best_probe), "
        "disjoint from both the training and the eval rows, so that what chooses a checkpoint never sees the items "
        "evaluation and the gate score; 0: no probe split.",
    )
    seed: int = Field(default=0, description="Seed for generation, shuffling and the train/eval split.")
    min_prompt_chars: int = Field(default=1, ge=1, description="Shortest prompt accepted by validation (characters).")
    max_prompt_chars: int = Field(default=4096, ge=1, description="Longest prompt accepted by validation (characters).")
    decontaminate: Literal["drop", "error", "off"] = Field(
        default="drop",
        description="Training rows (SFT's and the probe split's too) whose prompt overlaps a benchmark suite's "
        "prompts (a run of "
        "`decontaminate_ngram` words in common, case and punctuation ignored; a prompt shorter than that counts "
        "when it appears whole in the other, tasks/decontaminate.py): 'drop' leaves them out of training and "
        "reports how many per suite; 'error' stops the run, showing them; 'off' compares nothing.",
    )
    decontaminate_ngram: int = Field(
        default=13,
        ge=1,
        description="Words in a run that a training prompt and a benchmark prompt must share to overlap (word "
        "n-grams; 13 as in GPT-3's training-set filtering, appendix C of Brown et al. 2020). Smaller catches more "
        "paraphrases and more chance matches.",
    )

    @model_validator(mode="after")
    def _source_has_location(self) -> DataConfig:
        if self.source == "file" and not self.path:
            raise ValueError("data.source is 'file' but data.path is not set; set data.path=<file.jsonl|.parquet|.csv>")
        if self.source == "hf" and not self.hf_name:
            raise ValueError("data.source is 'hf' but data.hf_name is not set; set data.hf_name=<dataset name or dir>")
        if "{prompt}" not in self.prompt_template:
            raise ValueError("data.prompt_template must contain '{prompt}'")
        if self.system_prompt is not None and self.prompt_format != "chat":
            raise ValueError("data.system_prompt is set but data.prompt_format is 'text'; set data.prompt_format=chat")
        return self
