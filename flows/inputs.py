"""What the rounds train and are scored on: the recipe's training data and every eval suite's rows, validated, with
the rows that overlap a suite's prompts dropped (a staged recipe's stage's own prompts likewise), and what SFT's probe
reads."""

from __future__ import annotations

from typing import Any

from grpo_pipeline.configs.schema import HELDOUT, PipelineConfig
from grpo_pipeline.flows.stages import Stages, decontaminate, prepare_data, prepare_suite, validate_data
from grpo_pipeline.tasks.core.common import DatasetRefs, Ref
from grpo_pipeline.tasks.decontaminate import Decontamination
from grpo_pipeline.tasks.suites import suite_sources


def prepare_inputs(run: Stages, cfg: PipelineConfig) -> tuple[DatasetRefs, dict[str, Ref], Decontamination | None]:
    """The training data and every eval suite's rows, validated; training, SFT and probe rows that overlap a suite's
    prompts are dropped (data.decontaminate) before anything trains."""
    data = run("prepare_data", prepare_data, cfg=cfg.data, run_dir=cfg.run_dir)
    data = run("validate_data", validate_data, refs=data, cfg=cfg.data)
    suites = suite_sources(cfg.eval, data.eval, {
        s.name: run(f"prepare_suite-{s.name}", prepare_suite, suite=s, run_dir=cfg.run_dir)
        for s in cfg.eval.suites if s.source != HELDOUT
    })  # fmt: skip
    data, clean = decontaminated(run, cfg, data, suites)
    return data, suites, clean


def stage_inputs(run: Stages, cfg: PipelineConfig, stage: str, suites: dict[str, Ref]) -> DatasetRefs:
    """A stage's own prompts (its data: section), validated and decontaminated against every suite as the recipe's
    are, their stages named after it."""
    data = run(f"prepare_data-{stage}", prepare_data, cfg=cfg.data, run_dir=cfg.run_dir)
    data = run(f"validate_data-{stage}", validate_data, refs=data, cfg=cfg.data)
    return decontaminated(run, cfg, data, suites, stage)[0]


def decontaminated(
    run: Stages, cfg: PipelineConfig, data: DatasetRefs, suites: dict[str, Ref], stage: str = ""
) -> tuple[DatasetRefs, Decontamination | None]:
    """`data` less the training, SFT and probe rows that overlap a suite's prompts (data.decontaminate), with what
    was dropped from the training rows; `stage` names a staged recipe's stage whose own rows these are."""
    if cfg.data.decontaminate == "off":
        return data, None
    suffix = f"-{stage}" if stage else ""
    compare = {"suites": suites, "mode": cfg.data.decontaminate, "ngram": cfg.data.decontaminate_ngram,
               "run_dir": cfg.run_dir, "templates": prompt_templates(cfg)}  # fmt: skip
    clean = run(f"decontaminate{suffix}", decontaminate, train=data.train, **compare)
    kept = {"train": clean.train}
    if data.sft is not None:  # SFT's own rows (the training split and a drill): no stage trains on a suite's prompts
        kept["sft"] = run(f"decontaminate-sft{suffix}", decontaminate, listed=False, train=data.sft, **compare).train
    if data.probe is not None:  # the probe chooses checkpoints, ends SFT and stops rounds: it may not read a suite
        split = {"listed": False, "train": data.probe, "split": "probe"}
        kept["probe"] = run(f"decontaminate-probe{suffix}", decontaminate, **split, **compare).train
    return data.model_copy(update=kept), clean


def prompt_templates(cfg: PipelineConfig) -> dict[str, str]:
    """Each side's prompt_template (training's, and every suite's by name; the held-out split has training's), whose
    own text decontamination takes off the prompts before comparing what they ask."""
    suites = {name: cfg.eval.suite(name) for name in cfg.eval.suite_names()}
    return {
        "train": cfg.data.prompt_template,
        **{n: cfg.data.prompt_template if s.source == HELDOUT else s.prompt_template for n, s in suites.items()},
    }


def sft_bar(cfg: PipelineConfig, data: DatasetRefs) -> dict[str, Any]:
    """What SFT's probe reads when `sft.stop_at_accuracy` ends SFT at a bar; nothing otherwise, so that the eval
    settings key SFT only when its probe uses them."""
    if cfg.sft.stop_at_accuracy is None:
        return {}
    # evaluation's completions (episodes with its tools), decoded greedily, so its sampling settings key nothing
    return {"probe": data.probe, "correctness_reward": cfg.eval.correctness_reward,
            "probe_sampling": cfg.eval.sampling.greedy()}  # fmt: skip
