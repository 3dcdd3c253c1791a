"""`grpo-pipeline rehearse` (grpo_pipeline/rehearse.py): every shipped GPU recipe's whole DAG on CPU, on a tiny model
of its family (tasks/training/family_model.py), scored on its eval suites read from local copies (the real GSM8K and
HumanEval test sets in ../shared/data; rows in the columns of the other hub datasets from tests/rehearsal_rows.py),
registered under the rehearsal name; and the stand-in model itself (its class, tokenizer, chat template and EOS are
the family's)."""

from __future__ import annotations

import json
import operator
import re
from pathlib import Path

import pytest

from grpo_pipeline.configs.schema import ConfigError, PipelineConfig, load_config
from grpo_pipeline.rehearse import local_data_dir, rehearsal_config
from grpo_pipeline.rewards import build_rewards
from grpo_pipeline.tasks.release.card import rehearsal_lines
from grpo_pipeline.tasks.scoring.items import reward_columns
from grpo_pipeline.tasks.sources.load import load_source
from grpo_pipeline.tasks.training.family_model import FAMILIES, build_family_model, family_of
from tests.helpers import ROOT, cli_env, run_cli
from tests.rehearsal_rows import gsm8k_rows, mbpp_rows, open_r1_rows, write_jsonl

RECIPES = sorted((ROOT / "configs").glob("qwen2.5-*.yaml"))
GSM8K = ROOT / "configs" / "qwen2.5-0.5b-gsm8k.yaml"
CODER = ROOT / "configs" / "qwen2.5-coder-0.5b-verifiable-coding.yaml"
TEXTS = ["Natalia sold clips to 48 of her friends in April.", "def add(a, b):\n    return a + b\n", "#### 72"] * 20
# Local training rows for each hub training set, in its columns (../shared/data holds test sets only).
TRAIN_ROWS = {"openai/gsm8k": gsm8k_rows, "open-r1/verifiable-coding-problems-python": open_r1_rows}
# The local copy of each eval suite's hub dataset: a file of ../shared/data, or rows written here.
SHARED_SUITES = {"gsm8k_test": "gsm8k_test.jsonl", "humaneval": "HumanEval.jsonl.gz"}
SUITE_ROWS = {"mbpp": mbpp_rows}
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def local_data(recipe: Path, shared: Path, tmp: Path, run_dir: Path) -> list[str]:
    """Local copies of the recipe's hub datasets: its training rows, given as overrides (`data.source=file`), and each
    eval suite's dataset in the rehearsal's local-data folder under `run_dir`, named after the suite."""
    cfg = load_config(recipe, [f"run_dir={run_dir}"])
    folder = local_data_dir(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    for suite in cfg.eval.suites:
        if suite.name in SHARED_SUITES:
            shared_file = shared / SHARED_SUITES[suite.name]
            (folder / (suite.name + "".join(shared_file.suffixes))).symlink_to(shared_file)
        elif suite.source == "hf":
            write_jsonl(folder / f"{suite.name}.jsonl", SUITE_ROWS[suite.name]())
    train = write_jsonl(tmp / "local-train" / f"{cfg.name}.jsonl", TRAIN_ROWS[cfg.data.hf_name]())
    return [f"run_dir={run_dir}", "data.source=file", f"data.path={train}"]


def rehearsed(recipe: Path, shared: Path, tmp: Path) -> tuple[PipelineConfig, PipelineConfig]:
    """The recipe (its hub data pointed at local copies) and its rehearsal, run_dir under `tmp`."""
    original = load_config(recipe, local_data(recipe, shared, tmp, tmp))
    return original, rehearsal_config(original)


# ----------------------------------------------------------------------------- the stand-in model


@pytest.mark.parametrize("base", ["Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.2-1B-Instruct"])
def test_the_stand_in_has_its_familys_class_tokenizer_and_chat_template(base, tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    family = family_of(base)
    out = build_family_model(base, TEXTS, tmp_path / "model", seed=0)
    assert AutoConfig.from_pretrained(out).architectures == [family.architecture]
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.eos_token == family.turn_end  # an instruct model's turn ends its completion
    text = "Natalia sold 48 clips."
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text  # byte-level: lossless
    messages = [{"role": "system", "content": "Answer."}, {"role": "user", "content": "2+2?"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    whole = tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": "4"}], tokenize=False)
    assert whole.startswith(prompt)  # SFT trains on what follows the prompt, its EOS included
    assert family.turn_end in whole[len(prompt) :]
    for special in family.specials:  # each special token is one token, never split into bytes
        assert len(tokenizer(special, add_special_tokens=False)["input_ids"]) == 1


def test_a_base_checkpoint_ends_at_the_end_of_text_and_ships_no_sampling_defaults(tmp_path):
    from transformers import AutoTokenizer, GenerationConfig

    out = build_family_model("Qwen/Qwen2.5-Coder-0.5B", TEXTS, tmp_path / "model", seed=0)
    assert AutoTokenizer.from_pretrained(out).eos_token == FAMILIES["qwen2"].text_end
    assert GenerationConfig.from_pretrained(out).top_k in (None, 50)  # transformers' default, not an instruct one's


def test_a_local_checkpoint_is_recognised_by_its_config_and_others_are_refused(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert family_of(str(tmp_path / "ckpt")) is FAMILIES["llama"]
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    with pytest.raises(ConfigError, match="gpt_neox"):
        family_of(str(tmp_path / "ckpt"))
    with pytest.raises(ConfigError, match=r"model\.base=/path/to/checkpoint"):
        family_of("some-org/mystery-7b")


# ----------------------------------------------------------------------------- the rehearsal's config


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_the_rehearsal_keeps_the_recipes_task_and_never_its_names(recipe, shared_data, tmp_path):
    original, cfg = rehearsed(recipe, shared_data, tmp_path)
    assert cfg.registry.model_name == original.registry.model_name + "-rehearsal"
    assert cfg.registry.experiment == original.registry.experiment + "-rehearsal"
    assert Path(cfg.run_dir) == tmp_path / "rehearsal" and Path(cfg.model.base).is_relative_to(tmp_path / "rehearsal")
    # What is the recipe's own stays: data mapping and prompts, rewards, metric, gate, adapters, objective.
    assert cfg.data.model_dump(exclude={"num_train", "num_eval", "num_probe"}) == original.data.model_dump(
        exclude={"num_train", "num_eval", "num_probe"}
    )
    assert cfg.grpo.rewards == original.grpo.rewards and cfg.grpo.algorithm() == original.grpo.algorithm()
    assert cfg.eval.correctness_reward == original.eval.correctness_reward
    assert (cfg.registry.gating_metric, cfg.registry.min_delta) == (
        original.registry.gating_metric,
        original.registry.min_delta,
    )
    assert cfg.model.lora == original.model.lora and cfg.sft.enabled == original.sft.enabled
    # The same suites, mapped and scored alike, each hub dataset read from its local copy; the same guards.
    assert cfg.eval.suite_names() == original.eval.suite_names() and cfg.registry.guard == original.registry.guard
    mapping = {"prompt_column", "answer_column", "extra_columns", "prompt_template", "prompt_format", "system_prompt",
               "answer_pattern", "correctness_reward", "temperature", "top_p"}  # fmt: skip
    for name in original.eval.suite_names():
        was, now = original.eval.suite(name), cfg.eval.suite(name)
        assert now.model_dump(include=mapping) == was.model_dump(include=mapping), name
        scored, before = cfg.eval.for_suite(name), original.eval.for_suite(name)
        assert 10 <= scored.max_problems <= 16 and scored.max_new_tokens <= 32, name  # the gate still compares
        assert scored.n_samples <= before.n_samples and set(scored.k) <= set(before.k) | {1}, name
        if was.source == "hf":
            assert now.source == "file" and Path(now.path).is_file(), name
            assert any(line.startswith(f"eval.suites[{name}]: {was.hf_name} ") for line in cfg.rehearsal.changed)
    # Shrunk, never grown; the gate still compares (10 items at least).
    assert cfg.grpo.steps_per_round <= 4 and cfg.data.num_train <= 32 and cfg.eval.max_problems >= 10
    assert cfg.distributed.num_processes == min(original.distributed.num_processes, 2)
    notes = cfg.rehearsal
    assert notes.recipe == original.name
    assert any(line.startswith("model.base: " + original.model.base) for line in notes.changed)
    assert "vLLM" in " ".join(notes.not_rehearsed)  # this machine has no CUDA
    if original.model.load_in_4bit:
        assert not cfg.model.load_in_4bit and "rehearsed as LoRA" in " ".join(notes.not_rehearsed)
    if original.distributed.accelerate_config:
        assert cfg.distributed.accelerate_config is None and "gloo" in " ".join(notes.not_rehearsed)


# Recipe shapes a rehearsal on CPU cannot run as written, each with what it must say it replaced: the override, what
# the rehearsal's config then holds, a line of `changed` and words of `not_rehearsed`.
SHAPES = {
    "vllm server": (
        ["grpo.vllm_mode=server", "grpo.vllm_server_host=gpu-1"],
        {"grpo.vllm_mode": "colocate", "grpo.use_vllm": False},
        "grpo.vllm_mode: server -> colocate",
        "the vLLM server (grpo.vllm_mode: server, gpu-1:8000)",
    ),
    "vllm corrections": (
        ["grpo.vllm_importance_sampling_mode=token_mask", "grpo.vllm_importance_sampling_clip_min=0.5"],
        {"grpo.vllm_importance_sampling_mode": "sequence_mask", "grpo.vllm_importance_sampling_clip_min": None},
        "grpo.vllm_importance_sampling_mode: token_mask -> sequence_mask",
        "grpo.vllm_importance_sampling_mode, grpo.vllm_importance_sampling_clip_min",
    ),
    "vespo alone": (
        ["grpo.loss_type=vespo"],
        {"grpo.loss_type": "vespo", "grpo.use_vllm": False, "grpo.vllm_importance_sampling_mode": "sequence_mask"},
        "grpo.vllm_importance_sampling_mode: token_truncate -> sequence_mask",
        "the correction of vLLM's probabilities (grpo.vllm_importance_sampling_mode)",
    ),
    "off-policy masking of vLLM samples": (
        ["grpo.off_policy_mask_threshold=0.5"],
        {"grpo.off_policy_mask_threshold": None},
        "grpo.off_policy_mask_threshold: 0.5 -> None",
        "off-policy masking (grpo.off_policy_mask_threshold)",
    ),
    "pure float16 under DeepSpeed": (
        ["model.dtype=float16", "model.train_precision=pure",
         "distributed.accelerate_config=configs/accelerate/zero2.yaml"],
        {"model.train_precision": "mixed", "distributed.accelerate_config": None},
        "model.train_precision: pure -> mixed",
        "pure float16 training (model.train_precision: pure)",
    ),
}  # fmt: skip


def value_at(cfg: PipelineConfig, path: str) -> object:
    value: object = cfg
    for part in path.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize("shape", SHAPES)
def test_a_recipe_cpu_cannot_run_as_written_is_rehearsed_and_says_what(shape, shared_data, tmp_path, monkeypatch):
    monkeypatch.setattr("grpo_pipeline.tasks.training.trainer.has_cuda", lambda: False)
    monkeypatch.setattr("grpo_pipeline.tasks.scoring.vllm_generation.vllm_installed", lambda: False)
    overrides, expected, changed, not_rehearsed = SHAPES[shape]
    original = load_config(GSM8K, [*local_data(GSM8K, shared_data, tmp_path, tmp_path), *overrides])
    cfg = rehearsal_config(original)  # no "please report this"
    assert {path: value_at(cfg, path) for path in expected} == expected
    assert changed in cfg.rehearsal.changed
    assert not_rehearsed in " ".join(cfg.rehearsal.not_rehearsed)
    assert PipelineConfig.model_validate(cfg.model_dump(mode="json")) == cfg


def test_a_vllm_server_is_rehearsed_colocated_where_vllms_cpu_build_is_installed(shared_data, tmp_path, monkeypatch):
    monkeypatch.setattr("grpo_pipeline.tasks.training.trainer.has_cuda", lambda: False)
    monkeypatch.setattr("grpo_pipeline.tasks.scoring.vllm_generation.vllm_installed", lambda: True)
    original = load_config(GSM8K, [*local_data(GSM8K, shared_data, tmp_path, tmp_path), "grpo.vllm_mode=server"])
    cfg = rehearsal_config(original)
    assert (cfg.grpo.use_vllm, cfg.grpo.vllm_mode) == (True, "colocate")
    assert "grpo.vllm_mode: server -> colocate" in cfg.rehearsal.changed
    assert "the vLLM server (grpo.vllm_mode: server)" in " ".join(cfg.rehearsal.not_rehearsed)


def test_the_embedded_recipes_and_rehearsals_are_not_rehearsed(shared_data, tmp_path):
    with pytest.raises(ConfigError, match="grpo-pipeline run"):
        rehearsal_config(load_config(ROOT / "configs" / "tiny-arith.yaml"))
    _, once = rehearsed(GSM8K, shared_data, tmp_path)
    with pytest.raises(ConfigError, match="already rehearses"):
        rehearsal_config(once)


def test_the_gsm8k_rehearsal_evaluates_on_the_real_test_split(shared_data, tmp_path):
    original, cfg = rehearsed(GSM8K, shared_data, tmp_path)
    test = cfg.eval.suite("gsm8k_test")
    assert (test.source, Path(test.path)) == ("file", (shared_data / "gsm8k_test.jsonl").resolve())
    assert cfg.registry.gating_metric == "gsm8k_test/accuracy" and cfg.gating_suite() == "gsm8k_test"
    rows = load_source(test.data_config())  # the 1,319 problems, asked as the recipe asks them
    system, user = json.loads(rows.iloc[0]["prompt"])
    assert len(rows) == 1319 and system["content"] == original.data.system_prompt
    assert user["content"] == json.loads((shared_data / "gsm8k_test.jsonl").read_text().splitlines()[0])["question"]
    assert cfg.eval.for_suite("gsm8k_test").max_problems == 16  # scored on the first 16 in the rehearsal
    # What was replaced is said where the rehearsal is described: the summary and the model card.
    replaced = f"eval.suites[gsm8k_test]: openai/gsm8k (config 'main', split 'test') -> {Path(test.path)}"
    assert any(line.startswith(replaced) for line in cfg.rehearsal.changed)
    assert any(replaced in line for line in cfg.rehearsal.lines())
    assert "eval.suites[gsm8k_test].max_problems: None -> 16" in cfg.rehearsal.changed


def test_the_code_rehearsal_trains_on_code_rl_rows_and_scores_humaneval_and_mbpp(shared_data, tmp_path, code_sandbox):
    original, cfg = rehearsed(CODER, shared_data, tmp_path)
    assert cfg.data.source == "file" and "humaneval" not in Path(cfg.data.path).name.lower()
    humaneval, mbpp = cfg.eval.suite("humaneval"), cfg.eval.suite("mbpp")
    assert Path(humaneval.path) == (shared_data / "HumanEval.jsonl.gz").resolve()
    assert len(load_source(humaneval.data_config())) == 164
    assert Path(mbpp.path).parent == local_data_dir(original)
    assert (cfg.registry.gating_metric, cfg.registry.guard) == ("humaneval/pass_at_1", ["mbpp/pass_at_1"])
    # The MBPP stand-in rows are honest: each reference solution passes its asserts, by the suite's own scorer.
    rows = load_source(mbpp.data_config())
    (correct,), _ = build_rewards([cfg.eval.for_suite("mbpp").correctness_reward])
    prompts, columns = reward_columns(rows, 1)
    answers = [f"```python\n{code}```" for code in rows["answer"]]
    assert correct(prompts=prompts, completions=answers, **columns) == [1.0] * len(rows)
    assert correct(prompts=prompts, completions=["```python\npass\n```"] * len(rows), **columns) == [0.0] * len(rows)


def test_the_gsm8k_stand_in_rows_are_right():
    for row in gsm8k_rows():
        steps = re.findall(r"<<(\d+)([-+*])(\d+)=(\d+)>>", row["answer"])
        assert len(steps) == 2 and all(OPS[op](int(a), int(b)) == int(c) for a, op, b, c in steps)
        assert steps[0][3] == steps[1][0] and row["answer"].endswith(f"#### {steps[1][3]}")


def test_hub_suites_without_a_local_copy_say_where_to_put_one(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    train = write_jsonl(tmp_path / "train.jsonl", open_r1_rows())
    cfg = load_config(CODER, [f"run_dir={tmp_path}", "data.source=file", f"data.path={train}"])
    with pytest.raises(ConfigError) as err:
        rehearsal_config(cfg)
    message = str(err.value)
    assert "eval.suites[humaneval]: openai/openai_humaneval (split 'test') cannot be fetched: " in message
    assert "eval.suites[mbpp]: evalplus/mbppplus (split 'test') cannot be fetched" in message
    assert str(tmp_path / "rehearsal" / "local-data") in message and "heldout" not in message
    # One copy put there is read; the error then names the other alone.
    write_jsonl(local_data_dir(cfg) / "mbpp.jsonl", mbpp_rows())
    with pytest.raises(ConfigError, match=r"eval\.suites\[humaneval\]") as err:
        rehearsal_config(cfg)
    assert "eval.suites[mbpp]" not in str(err.value)


def test_hub_data_without_the_hub_names_the_local_copy_to_use(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    cfg = load_config(ROOT / "configs" / "qwen2.5-0.5b-gsm8k.yaml", [f"run_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"data\.source=file data\.path="):
        rehearsal_config(cfg)


def test_a_rehearsals_card_says_so_first():
    assert rehearsal_lines({}) == []
    assert "A rehearsal of recipe `qwen2.5-0.5b-gsm8k`" in rehearsal_lines({"rehearsal_of": "qwen2.5-0.5b-gsm8k"})[0]


# ----------------------------------------------------------------------------- end to end, as a user runs it


# A whole rehearsal of every shipped recipe (0.5-3 min each) runs in `make test-slow`; `make test` rehearses random
# valid recipes without training (tests/test_round_trips.py) and runs the same DAG on the embedded model.
@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_shipped_recipe_rehearses_and_registers_under_the_rehearsal_name(
    recipe, shared_data, code_sandbox, prefect_api, tmp_path
):
    summary_path = tmp_path / "summary.json"
    args = ["rehearse", "--config", str(recipe), *local_data(recipe, shared_data, tmp_path, tmp_path / "runs")]
    env = cli_env(tmp_path, PREFECT_API_URL=prefect_api)
    result = run_cli([*args, "--summary-json", str(summary_path)], env, timeout=900)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    summary = json.loads(summary_path.read_text())
    cfg = load_config(recipe)
    assert summary["recipe"] == cfg.name + "-rehearsal" and summary["rehearsal"]["recipe"] == cfg.name
    names = {r["model_name"] for r in summary["registrations"]}
    assert names == {cfg.registry.model_name + "-rehearsal"}, names
    assert [s["stage"] for s in summary["stages"] if s["stage"].startswith("grpo-round")]  # GRPO really trained
    assert "Rehearsal of " + cfg.name in out and "Not rehearsed here" in out  # the console says so
    if cfg.grpo.tools:  # each built-in tool really ran in the rehearsal, from a scripted call, and was answered
        assert [line for line in summary["rehearsal"]["demonstrated"] if "ran 1 call(s), 0 failed" in line]
    # Every policy was scored on every suite of the recipe, the hub ones from their local copies.
    assert [s["name"] for s in summary["suites"]] == cfg.eval.suite_names()
    for suite in cfg.eval.suites:
        assert suite.name in out
        if suite.source == "hf":
            assert f"eval.suites[{suite.name}]: {suite.hf_name}" in out


def test_the_tools_recipe_rehearses_on_qwens_own_tool_template(shared_data, tmp_path):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    from grpo_pipeline.agents.chat_tools import ChatToolLoop
    from grpo_pipeline.agents.loops import eval_tool_loop
    from grpo_pipeline.agents.trainer_args import check_tokenizer

    _, cfg = rehearsed(ROOT / "configs" / "qwen2.5-0.5b-gsm8k-tools.yaml", shared_data, tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.base)
    assert tokenizer.chat_template == qwen2_5_chat_template  # as Qwen2.5-Instruct's, tool branches included
    check_tokenizer(tokenizer)  # TRL's loop runs through it: calls rendered, parsed back, prefixes kept
    assert isinstance(eval_tool_loop(cfg.eval.sampling, tokenizer), ChatToolLoop)
    assert cfg.eval.tools == cfg.grpo.tools == ["python"]
    assert any(line.startswith("tool calls (python): the episodes ran") for line in cfg.rehearsal.not_rehearsed)


def test_the_tools_rehearsal_runs_a_real_call_and_its_result(shared_data, code_sandbox, tmp_path):
    """The stand-in's random weights seldom write a call, so the rehearsal runs one episode from a scripted call of
    the python tool: parsed by Qwen2.5's response template, run in the sandbox, its output appended as a tool message
    and the stand-in's next turn generated. Any break on that path (parsing, the tool, the result) fails it."""
    _, cfg = rehearsed(ROOT / "configs" / "qwen2.5-0.5b-gsm8k-tools.yaml", shared_data, tmp_path)
    (line,) = cfg.rehearsal.demonstrated
    assert re.fullmatch(r"python: a scripted call with .* ran 1 call\(s\), 0 failed, result '42\\n'; the stand-in "
                        r"then wrote [1-9]\d* tokens", line), line  # fmt: skip
    assert "Tool calls demonstrated (a scripted first turn):" in cfg.rehearsal.lines()


def test_a_guards_k_survives_the_rehearsals_fewer_samples(tmp_path):
    """The rehearsal shrinks eval.n_samples and eval.k; the k a guard reads from the eval section stays (the config
    check refuses a guard on a metric the evaluation would not produce)."""
    train = write_jsonl(tmp_path / "train.jsonl", gsm8k_rows())
    original = load_config(
        ROOT / "configs" / "qwen2.5-0.5b-gsm8k.yaml",
        [f"run_dir={tmp_path}", "data.source=file", f"data.path={train}", "eval.suites=[]",
         "registry.gating_metric=accuracy", "registry.guard=[pass_at_4]"],
    )  # fmt: skip
    cfg = rehearsal_config(original)
    assert 4 in cfg.eval.k and cfg.eval.n_samples >= 4 and cfg.registry.guard == ["pass_at_4"]
