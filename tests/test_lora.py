"""LoRA (peft): SFT and GRPO train adapters only, and save the policy with its adapter merged in.

Only the targeted modules' weights may differ between a stage's start and its result; embeddings, norms, the MLP
and the untargeted attention projections must be bit-identical. The merged result is a plain model that the next
stage starts from (so a round's reference model is the merged policy).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo_pipeline.configs.schema import ConfigError, load_config
from grpo_pipeline.tasks.core.common import Checkpoint
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.data import prepare_data
from grpo_pipeline.tasks.grpo import GRPORound, grpo_train
from grpo_pipeline.tasks.model import prepare_base_model
from grpo_pipeline.tasks.sft import sft_warmup
from grpo_pipeline.tasks.training.trainer import check_model_runtime, has_cuda

TARGETS = ("q_proj", "v_proj")


def weights(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    return load_file(str(Path(ckpt.path) / "model.safetensors"))


def changed(before: Checkpoint, after: Checkpoint) -> set[str]:
    a, b = weights(before), weights(after)
    assert a.keys() == b.keys(), "the merged model has the start model's tensors, no adapter tensors"
    return {name for name in a if not torch.equal(a[name], b[name])}


def test_lora_trains_only_the_targeted_modules_and_saves_merged(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        [
            f"run_dir={tmp_path}",
            "data.num_train=64",
            "data.num_eval=8",
            "model.tiny.hidden_size=32",
            "model.tiny.num_layers=2",
            "model.tiny.num_heads=2",
            "model.tiny.intermediate_size=64",
            f"model.lora={{r: 4, alpha: 8, dropout: 0.0, target_modules: [{', '.join(TARGETS)}]}}",
            "sft.max_steps=4",
            "sft.batch_size=8",
            "sft.learning_rate=1e-2",
            "grpo.steps_per_round=2",
            "grpo.prompts_per_step=4",
            "grpo.generations_per_prompt=4",
            "grpo.learning_rate=1e-2",
            "grpo.probe_problems=0",
            # rewards that tell the near-random completions apart, so the groups have an advantage to learn from
            "grpo.rewards=[{name: format, params: {pattern: '.*[0-9].*'}}]",  # has a digit: about half of them
        ],
    )
    data = prepare_data(cfg.data, cfg.run_dir)
    base = prepare_base_model(cfg.model, cfg.run_dir, cfg.seed)
    ctx = RunContext.of(cfg)

    sft = sft_warmup(base, data.train, cfg.sft, cfg.model, ctx)
    policy = grpo_train(
        GRPORound(start=sft, train=data.train, cfg=cfg.grpo, model_cfg=cfg.model, round_index=1, ctx=ctx)
    )

    for start, result in ((base, sft), (sft, policy)):
        diff = changed(start, result)
        assert diff, f"{result.stage} changed no weight"
        assert all(name.endswith(tuple(f"{t}.weight" for t in TARGETS)) for name in diff), sorted(diff)
    assert not list(Path(policy.path).glob("adapter_*"))  # saved merged, not as an adapter


def test_qlora_needs_lora_and_cuda() -> None:
    with pytest.raises(ConfigError, match=r"set model\.lora"):
        load_config(None, ["model.load_in_4bit=true"])
    cfg = load_config(None, ["model.load_in_4bit=true", "model.lora={}"])
    if has_cuda():
        pytest.skip("this machine has CUDA; the refusal is for machines without it")
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        check_model_runtime(cfg.model)
