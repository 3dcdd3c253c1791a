"""GRPO rollouts through vLLM: where they can run, and what makes them take each step's weights on CPU.

TRL's colocated engine (`grpo.vllm_mode: colocate`) gets the policy's weights after every optimizer step through the
model's `load_weights`, which copies each tensor into the engine's parameters in place. vLLM's CPU build, after
loading a checkpoint, hands every linear layer's weight to a packed GEMM kernel (oneDNN, SGL or zentorch) and drops
the parameter: the in-place load then has nothing to write into (the LM head keeps its parameter, but computes
through a kernel handle made from the first weights). On CPU the engine's linear layers therefore compute with
torch's own linear on their live parameters, as vLLM does for the layers it never packs; the synced weights are then
the ones that generate (tests/test_vllm.py). CUDA engines are left as they are.
"""

from __future__ import annotations

from typing import Any

from grpo_pipeline.configs.schema import ConfigError, GRPOStageConfig
from grpo_pipeline.tasks.scoring.vllm_generation import vllm_installed
from grpo_pipeline.tasks.training.trainer import has_cuda


def check_vllm_runtime(grpo: GRPOStageConfig) -> None:
    """Refuse, before anything runs, GRPO rollouts through vLLM where they cannot work: without the vllm package,
    or a `trl vllm-serve` server without CUDA (it receives the weights over NCCL). Colocated rollouts run on vLLM's
    CPU build too (slower than transformers' generate there, so `auto` takes vLLM only where CUDA is)."""
    if grpo.use_vllm is not True:
        return
    if grpo.vllm_mode == "server" and not has_cuda():
        raise ConfigError(
            "grpo.vllm_mode=server needs a CUDA GPU: `trl vllm-serve` receives the policy's weights after every step "
            "over NCCL; set grpo.vllm_mode=colocate (vLLM in the training process, CPU builds included)"
        )
    if not vllm_installed():
        raise ConfigError(
            "grpo.use_vllm=true needs the vllm package, which is not installed: pip install -e '.[gpu]' on a CUDA "
            "machine (vLLM's CPU build runs colocated rollouts too; tests/vllm_env.sh installs it), or set "
            "grpo.use_vllm=auto"
        )


def rollout_engine(use_vllm: bool, vllm_mode: str) -> str:
    """What generates the round's completions, in words (the round's meta records it)."""
    if not use_vllm:
        return "transformers generate"
    if vllm_mode == "server":
        return "vLLM server (trl vllm-serve)"
    return "vLLM colocated" + ("" if has_cuda() else " (CPU build, linear layers on live weights)")


def prepare_vllm_rollouts(use_vllm: bool) -> None:
    """Before TRL builds a colocated engine on CPU: its linear layers compute with torch's linear on their live
    parameters, so that each step's weights load in place (this module's docstring says why)."""
    if not use_vllm or has_cuda():
        return
    from vllm.model_executor.layers import utils

    packing = utils.dispatch_cpu_unquantized_gemm  # linear.py and vocab_parallel_embedding.py look it up per layer
    if hasattr(packing, "packing"):  # done already in this process
        return

    def live(layer: Any, remove_weight: bool) -> None:
        if layer.weight.ndim != 2:  # convolution and expert weights keep vLLM's own handling
            packing(layer, remove_weight)
            return
        import torch

        layer.cpu_linear = torch.nn.functional.linear

    live.packing = packing  # type: ignore[attr-defined]  # vLLM's own, for whoever needs it back
    utils.dispatch_cpu_unquantized_gemm = live
