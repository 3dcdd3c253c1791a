"""Training precision that keeps updates (model.train_precision).

A bfloat16 weight of ~0.02 is stored to about 1e-4 (8 bits of mantissa), so an Adam step at lr 5e-6 rounds away
when the weights themselves are bfloat16: pure bf16 full fine-tuning silently trains almost nothing. In mixed
precision the weights and the optimizer state stay float32 (autocast computes in bf16 where CUDA has it), and every
weight moves. The stage's meta.json and the checkpoint say which dtypes training used, read from the trainer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grpo_pipeline.configs.schema import ConfigError, load_config
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.training.trainer import adapter_args, precision_args, precision_line

TINY = [
    "seed=0",
    "data.synthetic.max_digits=1",
    "data.num_train=48",
    "data.num_eval=4",
    "data.num_probe=0",
    "model.dtype=bfloat16",
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64",
    "model.tiny.max_positions=16",
    "sft.max_steps=3",
    "sft.learning_rate=5e-6",
    "sft.warmup_ratio=0",
    "sft.batch_size=16",
    "sft.save_every_steps=0",
]


def test_full_fine_tuning_loads_float32_master_weights_unless_pure():
    mixed = load_config(None, ["model.dtype=bfloat16"]).model
    pure = load_config(None, ["model.dtype=bfloat16", "model.train_precision=pure"]).model
    lora = load_config(None, ["model.dtype=bfloat16", "model.lora={}"]).model
    assert precision_args(mixed)["model_init_kwargs"]["dtype"] == torch.float32
    assert precision_args(pure)["model_init_kwargs"]["dtype"] == "bfloat16"
    assert precision_args(lora)["model_init_kwargs"]["dtype"] == "bfloat16"  # a frozen base; adapters are float32


def test_pure_float16_full_fine_tuning_is_refused_unless_deepspeed_or_fsdp_keeps_master_weights(tmp_path):
    # fp16's loss scaler cannot unscale float16 gradients: the run would fail at its first step on CUDA.
    pure = ["model.dtype=float16", "model.train_precision=pure"]
    fix = r"set model.train_precision=mixed .*or model.dtype=bfloat16.*DeepSpeed or FSDP"
    with pytest.raises(ConfigError, match=fix):
        load_config(None, pure)
    launch = Path(__file__).resolve().parents[1] / "configs" / "accelerate"
    with pytest.raises(ConfigError, match=r"ddp.yaml is not one of them"):
        load_config(None, [*pure, f"distributed.accelerate_config={launch / 'ddp.yaml'}"])
    for fine in (
        f"distributed.accelerate_config={launch / 'zero2.yaml'}",
        f"distributed.accelerate_config={launch / 'fsdp2.yaml'}",
        "model.lora={}",  # float32 adapters over a frozen float16 base
        "model.train_precision=mixed",
        "model.dtype=bfloat16",
    ):
        load_config(None, [*pure, fine])


@pytest.mark.parametrize(("dtype", "compute"), [("float16", torch.float16), ("bfloat16", torch.bfloat16)])
def test_qlora_computes_in_the_model_dtype(dtype, compute):
    cfg = load_config(None, ["model.lora={}", "model.load_in_4bit=true", f"model.dtype={dtype}"]).model
    assert adapter_args(cfg)["quantization_config"].bnb_4bit_compute_dtype == compute


def test_the_precision_line_names_each_dtype():
    assert precision_line({"weights": "float32", "optimizer_state": "float32", "autocast": "bf16"}) == (
        "float32 weights and optimizer state, bf16 autocast"
    )
    assert precision_line({"weights": "bfloat16", "optimizer_state": "bfloat16", "autocast": "none"}) == (
        "bfloat16 weights and optimizer state, no autocast"
    )


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from grpo_pipeline.tasks.data import prepare_data
    from grpo_pipeline.tasks.model import prepare_base_model

    run_dir = tmp_path_factory.mktemp("precision")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        cfg = load_config(None, [*TINY, f"run_dir={run_dir}"])
        data = prepare_data(cfg.data, cfg.run_dir)
        yield run_dir, data.train, prepare_base_model(cfg.model, cfg.run_dir, cfg.seed)


def moved_fraction(before: Path, after: Path) -> float:
    """The fraction of weight elements (every tensor) that training changed: the end against the start in the dtype
    training held the weights in (a float32 start cast to bfloat16 is not an update)."""
    from safetensors.torch import load_file

    start, end = load_file(str(before / "model.safetensors")), load_file(str(after / "model.safetensors"))
    moved = sum(int((start[k].to(end[k].dtype) != end[k]).sum()) for k in start)
    return moved / sum(t.numel() for t in start.values())


@pytest.mark.integration
@pytest.mark.parametrize("precision", ["mixed", "pure"])
def test_a_small_update_survives_in_mixed_precision_and_not_in_pure_bf16(base, precision):
    from grpo_pipeline.tasks.sft import sft_warmup

    run_dir, train, start = base
    cfg = load_config(None, [*TINY, f"run_dir={run_dir}", f"model.train_precision={precision}"])
    ctx = RunContext(run_dir=str(run_dir), experiment="precision", recipe=precision, seed=0)
    policy = sft_warmup(start, train, cfg.sft, cfg.model, ctx)
    meta = json.loads((Path(policy.path) / "meta.json").read_text())["precision"]
    fraction = moved_fraction(Path(start.path), Path(policy.path))
    if precision == "mixed":
        assert meta == {"weights": "float32", "optimizer_state": "float32", "autocast": "none"}  # no CUDA here
        assert policy.precision == "float32 weights and optimizer state, no autocast"
        assert fraction > 0.95, fraction  # nearly every weight moved
    else:
        assert meta["weights"] == meta["optimizer_state"] == "bfloat16"
        assert fraction < 0.2, fraction  # the updates rounded away: what mixed precision prevents
