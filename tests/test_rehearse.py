"""`grpo-pipeline rehearse` (grpo_pipeline/rehearse.py): every shipped GPU recipe's whole DAG on CPU, on a tiny model
of its family (tasks/training/family_model.py) and the real GSM8K / HumanEval files, registered under the rehearsal
name; and the stand-in model itself (its class, tokenizer, chat template and EOS are the family's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_pipeline.configs.schema import ConfigError, load_config
from grpo_pipeline.rehearse import rehearsal_config
from grpo_pipeline.tasks.release.card import rehearsal_lines
from grpo_pipeline.tasks.training.family_model import FAMILIES, build_family_model, family_of
from tests.helpers import ROOT, cli_env, run_cli

RECIPES = sorted((ROOT / "configs").glob("qwen2.5-*.yaml"))
DATA = {"humaneval": "HumanEval.jsonl.gz", "gsm8k": "gsm8k_test.jsonl"}
TEXTS = ["Natalia sold clips to 48 of her friends in April.", "def add(a, b):\n    return a + b\n", "#### 72"] * 20


def local_data(recipe: Path, shared: Path) -> list[str]:
    """The recipe's hub dataset redirected to the local copy in ../shared/data (the same columns)."""
    name = next(v for k, v in DATA.items() if k in recipe.stem)
    return ["data.source=file", f"data.path={shared / name}"]


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
    original = load_config(recipe, [f"run_dir={tmp_path}", *local_data(recipe, shared_data)])
    cfg = rehearsal_config(original)
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


def test_the_embedded_recipes_and_rehearsals_are_not_rehearsed(shared_data, tmp_path):
    with pytest.raises(ConfigError, match="grpo-pipeline run"):
        rehearsal_config(load_config(ROOT / "configs" / "tiny-arith.yaml"))
    gsm8k = ROOT / "configs" / "qwen2.5-0.5b-gsm8k.yaml"
    once = rehearsal_config(load_config(gsm8k, [f"run_dir={tmp_path}", *local_data(gsm8k, shared_data)]))
    with pytest.raises(ConfigError, match="already rehearses"):
        rehearsal_config(once)


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


@pytest.mark.integration
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_shipped_recipe_rehearses_and_registers_under_the_rehearsal_name(
    recipe, shared_data, code_sandbox, prefect_api, tmp_path
):
    summary_path = tmp_path / "summary.json"
    args = ["rehearse", "--config", str(recipe), f"run_dir={tmp_path / 'runs'}", *local_data(recipe, shared_data)]
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
