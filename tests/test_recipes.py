"""The GPU recipes on a CPU machine: they validate, map real GSM8K / HumanEval rows (and local rows in the columns of
the hub datasets ../shared/data has no copy of) to what their rewards read, score right and wrong completions as
intended, evaluate on the benchmarks' own test sets, pass their vLLM settings to TRL, and stop at once, naming the
model and dataset and how to use local copies, where the hub cannot be reached. The GPU parts: tests/test_gpu.py."""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_pipeline.configs.schema import ConfigError, GRPOStageConfig, load_config
from grpo_pipeline.rewards import build_rewards
from grpo_pipeline.tasks.core import hub
from grpo_pipeline.tasks.data import load_source
from grpo_pipeline.tasks.decontaminate import contaminated
from grpo_pipeline.tasks.grpo import trl_grpo_args
from grpo_pipeline.tasks.scoring.items import reward_columns
from grpo_pipeline.tasks.sources.tables import format_prompt, read_table
from tests.helpers import cli_env, run_cli
from tests.rehearsal_rows import mbpp_rows, open_r1_rows, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
GSM8K = ROOT / "configs" / "qwen2.5-0.5b-gsm8k.yaml"
CODER = ROOT / "configs" / "qwen2.5-coder-0.5b-verifiable-coding.yaml"
RECIPES = sorted((ROOT / "configs").glob("qwen2.5-*.yaml"))
BENCHMARK = ROOT / "benchmarks" / "gpu_throughput.py"
VARIANTS = ("lora", "qlora", "multigpu")


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _benchmark_module():
    spec = importlib.util.spec_from_file_location("gpu_throughput", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def weighted(rewards, rows, completions: list[str]) -> list[float]:
    """The summed, weighted `rewards` of each completion of `rows` (one completion per row), as GRPO sums them."""
    fns, weights = build_rewards(rewards)
    prompts, columns = reward_columns(rows, 1)
    per_reward = [fn(prompts=prompts, completions=completions, **columns) for fn in fns]
    return [sum(w * s[i] for w, s in zip(weights, per_reward, strict=True)) for i in range(len(rows))]


# ----------------------------------------------------------------------------- the recipes


def test_the_gpu_recipes_are_bundled():
    variants = {ROOT / "configs" / f"qwen2.5-0.5b-gsm8k-{v}.yaml" for v in VARIANTS}
    assert {GSM8K, CODER, *variants} <= set(RECIPES)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_validates_through_the_cli(recipe, tmp_path):
    result = run_cli(["config", "--config", str(recipe)], cli_env(tmp_path), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    cfg = load_config(recipe)
    assert f"base: {cfg.model.base}" in result.stdout
    assert cfg.model.dtype == "bfloat16" and cfg.grpo.vllm_mode == "colocate" and cfg.grpo.use_vllm == "auto"


def test_gsm8k_recipe(shared_data):
    cfg = load_config(GSM8K)
    assert cfg.model.base == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (cfg.data.hf_name, cfg.data.hf_config, cfg.data.hf_split) == ("openai/gsm8k", "main", "train")
    assert {(r.name, r.weight) for r in cfg.grpo.rewards} == {("correctness", 2.0), ("format", 0.5), ("tag_count", 0.5)}
    # The recipe's column mapping on the real GSM8K file (same columns as the hub dataset).
    cfg = load_config(GSM8K, ["data.source=file", f"data.path={shared_data / 'gsm8k_test.jsonl'}"])
    rows = load_source(cfg.data).head(4)
    first = rows.iloc[0]
    system, user = json.loads(first["prompt"])  # chat messages, rendered by the model's template in training
    assert system["role"] == "system" and "<reasoning>" in system["content"] and "<answer>" in system["content"]
    assert user == {"role": "user", "content": first_question(shared_data / "gsm8k_test.jsonl")}
    assert first["answer"].replace("-", "").isdigit(), first["answer"]  # the number after '#### '
    right = [f"<reasoning>\nwork it out\n</reasoning>\n<answer>\n{a}\n</answer>" for a in rows["answer"]]
    wrong = [f"<reasoning>\nwork it out\n</reasoning>\n<answer>\n{int(a) + 1}\n</answer>" for a in rows["answer"]]
    unformatted = [f"The answer is {a}." for a in rows["answer"]]
    assert weighted(cfg.grpo.rewards, rows, right) == pytest.approx(
        [3.0] * 4
    )  # 2.0 correct + 0.5 format + 0.5 four tags
    assert weighted(cfg.grpo.rewards, rows, wrong) == pytest.approx([1.0] * 4)
    assert weighted(cfg.grpo.rewards, rows, unformatted) == pytest.approx(
        [2.0] * 4
    )  # math-verify finds the bare number


def test_gsm8k_recipes_gate_on_the_test_split_asked_as_training_asks(shared_data):
    """GSM8K's 1,319 test problems are a suite of every GSM8K recipe, mapped and prompted exactly as the training
    rows are, and the gate decides on its accuracy; the held-out split of the train split is scored beside it."""
    for recipe in sorted((ROOT / "configs").glob("qwen2.5-0.5b-gsm8k*.yaml")):
        cfg = load_config(recipe)
        assert cfg.eval.suite_names() == ["gsm8k_test", "heldout"], recipe.name
        assert (cfg.registry.gating_metric, cfg.gating_suite()) == ("gsm8k_test/accuracy", "gsm8k_test")
        test = cfg.eval.suite("gsm8k_test")
        assert (test.source, test.hf_name, test.hf_config, test.hf_split) == ("hf", "openai/gsm8k", "main", "test")
        assert test.max_problems is None and cfg.eval.for_suite("gsm8k_test").max_problems is None  # all 1,319
        mapping = ("prompt_column", "answer_column", "answer_pattern", "prompt_template", "prompt_format")
        assert {f: getattr(test, f) for f in mapping} == {f: getattr(cfg.data, f) for f in mapping}
        assert test.system_prompt == cfg.data.system_prompt and test.system_prompt
        assert cfg.eval.for_suite("gsm8k_test").correctness_reward == cfg.eval.correctness_reward
    # The suite's rows from the real test file: all of them, each exactly the prompt training would build from it.
    cfg = load_config(GSM8K, ["data.source=file", f"data.path={shared_data / 'gsm8k_test.jsonl'}"])
    local = cfg.eval.suite("gsm8k_test").model_copy(
        update={"source": "file", "path": str(shared_data / "gsm8k_test.jsonl")}
    )
    suite_rows, train_rows = load_source(local.data_config()), load_source(cfg.data)
    assert len(suite_rows) == 1319
    assert suite_rows[["prompt", "answer"]].equals(train_rows[["prompt", "answer"]])


def first_question(path: Path) -> str:
    return json.loads(path.read_text().splitlines()[0])["question"]


def test_gsm8k_variants_differ_from_it_only_where_they_say():
    """LoRA, QLoRA for small GPUs and several GPUs: the same task, rewards, data, suites and gate as the base recipe."""
    base = load_config(GSM8K)
    lora, qlora, multi = (load_config(ROOT / "configs" / f"qwen2.5-0.5b-gsm8k-{v}.yaml") for v in VARIANTS)
    for variant in (lora, qlora, multi):
        assert (variant.data, variant.grpo.rewards, variant.eval.correctness_reward) == (
            base.data,
            base.grpo.rewards,
            base.eval.correctness_reward,
        )
        assert variant.eval.suites == base.eval.suites
        assert (variant.registry.gating_metric, variant.registry.guard) == (
            base.registry.gating_metric,
            base.registry.guard,
        )
        assert variant.registry.model_name != base.registry.model_name  # their versions are not mixed up
    assert lora.model.lora is not None and not lora.model.load_in_4bit and base.model.lora is None
    assert qlora.model.load_in_4bit and qlora.model.lora is not None
    small = qlora.grpo.prompts_per_step * qlora.grpo.generations_per_prompt * qlora.grpo.max_completion_tokens
    large = base.grpo.prompts_per_step * base.grpo.generations_per_prompt * base.grpo.max_completion_tokens
    assert small < large / 2  # a step's tokens, which set its activation memory
    assert multi.distributed.num_processes > 1 and multi.grpo.prompts_per_step % multi.distributed.num_processes == 0
    assert (ROOT / multi.distributed.accelerate_config).is_file()  # relative to the project, where runs start


# ----------------------------------------------------------------------------- the code recipe


def test_the_code_recipe_trains_on_code_rl_problems_and_evaluates_on_the_benchmarks():
    cfg = load_config(CODER)
    assert cfg.model.base == "Qwen/Qwen2.5-Coder-0.5B-Instruct" and cfg.data.prompt_format == "chat"
    # Training: open-r1's verifiable coding problems, never a benchmark the recipe is evaluated on.
    assert (cfg.data.hf_name, cfg.data.hf_split) == ("open-r1/verifiable-coding-problems-python", "train")
    assert cfg.data.extra_columns == ["verification_info"] and cfg.data.decontaminate == "drop"
    benchmarks = {s.name: s for s in cfg.eval.suites if s.source == "hf"}
    assert cfg.data.hf_name not in {s.hf_name for s in benchmarks.values()}
    assert "humaneval" not in cfg.data.hf_name.lower() and "mbpp" not in cfg.data.hf_name.lower()
    # Evaluation: every problem of HumanEval and MBPP, scored by their tests.
    assert cfg.eval.suite_names() == ["humaneval", "mbpp", "heldout"]
    humaneval, mbpp = benchmarks["humaneval"], benchmarks["mbpp"]
    assert (humaneval.hf_name, humaneval.hf_split) == ("openai/openai_humaneval", "test")
    assert {"test", "entry_point"} <= set(humaneval.extra_columns)
    assert (mbpp.hf_name, mbpp.hf_split) == ("evalplus/mbppplus", "test") and "test_list" in mbpp.extra_columns
    for name in cfg.eval.suite_names():
        scored = cfg.eval.for_suite(name)
        assert scored.correctness_reward.name == "code_tests" and scored.max_problems is None, name
        assert max(scored.k) <= scored.n_samples <= scored.batch_size
    assert cfg.eval.for_suite("humaneval").k == [1, 5, 10] and cfg.eval.for_suite("humaneval").n_samples == 10
    assert (cfg.registry.gating_metric, cfg.registry.guard) == ("humaneval/pass_at_1", ["mbpp/pass_at_1"])


def test_the_code_recipe_scores_its_training_rows_by_their_tests(tmp_path, code_sandbox):
    """Rows in open-r1's columns (tests/rehearsal_rows.py): each reference solution passes its stdin/stdout or call
    tests in the sandbox; a program that prints one number passes almost none."""
    path = write_jsonl(tmp_path / "train.jsonl", open_r1_rows(8))
    cfg = load_config(CODER, ["data.source=file", f"data.path={path}"])
    rows = load_source(cfg.data)
    system, user = json.loads(rows.iloc[0]["prompt"])  # the instruction, then the problem alone
    assert system["content"] == cfg.data.system_prompt and "```python" in system["content"]
    assert user == {"role": "user", "content": open_r1_rows(1)[0]["problem_statement"]}
    assert weighted(cfg.grpo.rewards, rows, rows["answer"].tolist()) == pytest.approx([1.0] * 8)
    assert sum(weighted(cfg.grpo.rewards, rows, ["```python\nprint(1)\n```"] * 8)) < 1.0


def test_the_code_recipe_asks_humaneval_as_evalplus_does(shared_data, code_sandbox):
    cfg = load_config(CODER)
    suite = cfg.eval.suite("humaneval").model_copy(
        update={"source": "file", "path": str(shared_data / "HumanEval.jsonl.gz")}
    )
    rows = load_source(suite.data_config())
    assert len(rows) == 164 and {"test", "entry_point"} <= set(rows.columns)
    (user,) = json.loads(rows.iloc[0]["prompt"])  # no system prompt: the model's own, as EvalPlus leaves it
    assert user["content"].startswith("Please provide a self-contained Python script that solves the following")
    raw = read_table(shared_data / "HumanEval.jsonl.gz").head(3)
    assert all(p in json.loads(q)[0]["content"] for p, q in zip(raw["prompt"], rows["prompt"], strict=False))
    # An instruct model answers with the whole function in a fenced block: the reference one passes every test.
    whole = [
        f"Here it is:\n```python\n{p}{s}```\n" for p, s in zip(raw["prompt"], raw["canonical_solution"], strict=True)
    ]
    correct = [cfg.eval.for_suite("humaneval").correctness_reward]
    assert weighted(correct, rows.head(3), whole) == pytest.approx([1.0] * 3)
    assert weighted(correct, rows.head(3), ["```python\npass\n```"] * 3) == pytest.approx([0.0] * 3)


def test_decontamination_drops_a_benchmark_prompt_planted_in_the_code_rl_rows(shared_data):
    """A HumanEval problem among the code-RL training rows is caught by the recipe's own decontamination (13-word
    runs), though training and evaluation ask it in other words; the clean rows overlap nothing, neither the
    benchmarks nor the held-out rows, which are asked as training asks: what the recipe wraps around a problem never
    makes a row look contaminated."""
    cfg = load_config(CODER)
    humaneval = read_table(shared_data / "HumanEval.jsonl.gz")
    suite_cfg = {name: cfg.eval.suite(name).data_config() for name in ("humaneval", "mbpp")}
    problems = [r["problem_statement"] for r in open_r1_rows(80)]
    benchmark = {
        "humaneval": [format_prompt(suite_cfg["humaneval"], p) for p in humaneval["prompt"]],
        "mbpp": [format_prompt(suite_cfg["mbpp"], r["prompt"]) for r in mbpp_rows()],
        "heldout": [format_prompt(cfg.data, p) for p in problems[60:]],
    }
    train = [format_prompt(cfg.data, p) for p in problems[:60]]
    planted = len(train) // 2
    train.insert(planted, format_prompt(cfg.data, humaneval["prompt"][7]))
    hits = contaminated(train, benchmark, cfg.data.decontaminate_ngram)
    assert hits == {"humaneval": [planted], "mbpp": [], "heldout": []}


# ----------------------------------------------------------------------------- vLLM settings -> TRL


def _trl_args(tmp_path, **fields):
    cfg = GRPOStageConfig(**fields)
    common = {"output_dir": str(tmp_path), "report_to": [], "bf16": False}  # as precision_args gives on CPU
    return trl_grpo_args(cfg, common, [1.0] * len(cfg.rewards))


def test_colocate_is_the_default(tmp_path):
    args = _trl_args(tmp_path, use_vllm=True, vllm_gpu_memory_utilization=0.45)
    assert (args.use_vllm, args.vllm_mode, args.vllm_gpu_memory_utilization) == (True, "colocate", 0.45)


def test_server_mode_maps_host_port_and_url(tmp_path):
    args = _trl_args(tmp_path, use_vllm=True, vllm_mode="server", vllm_server_host="10.0.0.7", vllm_server_port=8123)
    assert (args.use_vllm, args.vllm_mode) == (True, "server")
    assert (args.vllm_server_host, args.vllm_server_port, args.vllm_server_base_url) == ("10.0.0.7", 8123, None)
    args = _trl_args(tmp_path, use_vllm=True, vllm_mode="server", vllm_server_base_url="http://gpu-1:8000")
    assert args.vllm_server_base_url == "http://gpu-1:8000"  # TRL's client then ignores host and port


def test_auto_without_cuda_generates_with_transformers_and_says_so(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="grpo_pipeline"):
        args = _trl_args(tmp_path, vllm_mode="server")  # use_vllm: auto, and this machine has no CUDA
    assert args.use_vllm is False
    assert "vllm_mode is 'server' but vLLM is not used here" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["grpo.use_vllm=false", "grpo.vllm_mode=server"], "set grpo.use_vllm=true"),
        (["grpo.vllm_mode=remote"], "grpo.vllm_mode"),
        (["grpo.vllm_server_base_url=gpu-1:8000"], "http://<host>:<port>"),
        (["grpo.vllm_gpu_memory_utilization=1.5"], "grpo.vllm_gpu_memory_utilization"),
    ],
)
def test_bad_vllm_settings_name_the_fix(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        load_config(GSM8K, overrides)
    assert fragment in str(err.value)


def test_server_address_is_not_part_of_the_grpo_key():
    """Moving the vLLM server (or giving colocated vLLM more memory) must not rerun a finished GRPO round."""
    from grpo_pipeline.configs.schema import section_hash

    a = load_config(GSM8K).grpo
    b = load_config(GSM8K, ["grpo.vllm_server_port=9000", "grpo.vllm_gpu_memory_utilization=0.5"]).grpo
    c = load_config(GSM8K, ["grpo.vllm_mode=server"]).grpo
    assert section_hash(a) == section_hash(b) != section_hash(c)


# ----------------------------------------------------------------------------- no hub: one clear error, at once


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set"),
        # A hub that refuses connections (nothing listens on port 9 of loopback), without HF_HUB_OFFLINE.
        ({"HF_ENDPOINT": "http://127.0.0.1:9"}, "cannot be reached"),
    ],
    ids=["offline", "unreachable"],
)
def test_run_without_the_hub_stops_at_once_naming_the_fix(tmp_path, env, why):
    # An empty Hugging Face cache, so a copy cached on this machine cannot make the run go ahead.
    env = {k: v for k, v in cli_env(tmp_path, HF_HOME=str(tmp_path / "hf-home")).items() if "OFFLINE" not in k} | env
    result = run_cli(["run", "--config", str(GSM8K), f"run_dir={tmp_path / 'runs'}"], env, timeout=120)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "Starting temporary server" not in out  # stopped before Prefect
    model_line = next(line for line in out.splitlines() if "model.base 'Qwen/Qwen2.5-0.5B-Instruct'" in line)
    data_line = next(line for line in out.splitlines() if "data.hf_name 'openai/gsm8k'" in line)
    assert why in model_line and why in data_line
    assert "model.base=/path/to/model_dir" in model_line and "hf download Qwen/Qwen2.5-0.5B-Instruct" in model_line
    assert "data.hf_name=/path/to/dataset_dir" in data_line and "save_to_disk" in data_line
    assert "Traceback" not in out


def test_hub_names_in_the_local_cache_pass_offline(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert hub.model_problem("Qwen/Qwen2.5-0.5B-Instruct") is not None
    # The layout huggingface_hub writes: refs/main names the snapshot that holds the files.
    repo = tmp_path / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    assert hub.model_problem("Qwen/Qwen2.5-0.5B-Instruct") is None
    cfg = load_config(GSM8K).data
    assert hub.dataset_problem(cfg) is not None
    (tmp_path / "hub" / "datasets--openai--gsm8k").mkdir()
    assert hub.dataset_problem(cfg) is None


def test_local_models_and_datasets_never_ask_the_hub(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "_why_not", lambda *a: pytest.fail(f"asked the hub about {a}"))
    for base in ("tiny", str(tmp_path), "./models/mine", "models:/tiny-arith-grpo@champion"):
        assert hub.model_problem(base) is None
    assert hub.dataset_problem(load_config(GSM8K, [f"data.hf_name={tmp_path}"]).data) is None
    assert hub.dataset_problem(load_config(None).data) is None  # synthetic


# ----------------------------------------------------------------------------- the GPU benchmark on CPU


@pytest.mark.skipif(_has_cuda(), reason="on a CUDA machine the benchmark measures (minutes) instead")
def test_gpu_benchmark_says_there_is_no_cuda_and_exits_0():
    result = subprocess.run([sys.executable, str(BENCHMARK)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "no CUDA device here" in result.stdout and "nothing was measured" in result.stdout


def test_benchmark_model_has_qwen25_05b_shape(tmp_path):
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    gt = _benchmark_module()
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**gt.QWEN25_05B))
    assert sum(p.numel() for p in model.parameters()) == gt.QWEN25_05B_PARAMETERS
    # The same builder at a small size: the saved tokenizer loads as Qwen2's, round-trips text and decodes any id.
    shape = {**gt.QWEN25_05B, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    shape |= {"num_key_value_heads": 1, "intermediate_size": 64, "vocab_size": 300, "max_position_embeddings": 64}
    out = gt.build_qwen2(tmp_path / "m", shape, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(out)
    text = "Natalia sold 48 clips.\n<|im_end|>"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text and ids[-1] == tokenizer.eos_token_id
    assert len(tokenizer) == 300 and tokenizer.decode([299]) == "<x299>"
    model = Qwen2ForCausalLM.from_pretrained(out)
    assert model.config.model_type == "qwen2" and model.config.vocab_size == 300


def test_vllm_rollouts_that_cannot_run_here_are_refused_before_anything_runs():
    """Colocated vLLM rollouts need the vllm package (a CUDA build, or vLLM's CPU build: tests/test_vllm.py trains
    with it); a `trl vllm-serve` server needs CUDA (NCCL) whatever is installed. Each is one clear error; `auto`
    generates with transformers where CUDA is absent."""
    from grpo_pipeline.tasks.training.vllm_rollouts import check_vllm_runtime

    if _has_cuda():
        pytest.skip("this machine has CUDA, where vLLM rollouts run")
    with pytest.raises(ConfigError, match=r"grpo\.vllm_mode=server needs a CUDA GPU.*grpo\.vllm_mode=colocate"):
        check_vllm_runtime(load_config(GSM8K, ["grpo.use_vllm=true", "grpo.vllm_mode=server"]).grpo)
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ConfigError, match=r"grpo\.use_vllm=true needs the vllm package.*grpo\.use_vllm=auto"):
            check_vllm_runtime(load_config(GSM8K, ["grpo.use_vllm=true"]).grpo)
    check_vllm_runtime(load_config(GSM8K).grpo)  # auto: no error
