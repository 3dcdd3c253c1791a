"""Tool calls in text (agents/text_tools.py): the call syntax, the episode loop with its mask and counts, the final
answer reward, the imperfect tool teacher, and the loop through TRL's rollout_func, evaluation and the probe."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from grpo_pipeline.agents.episodes import episode_stats, run_episodes
from grpo_pipeline.agents.registry import ToolError
from grpo_pipeline.agents.text_tools import TextToolLoop, open_call, text_rollout_kwargs, text_tool_loop
from grpo_pipeline.configs.data import SyntheticTaskConfig
from grpo_pipeline.configs.grpo import GRPOStageConfig
from grpo_pipeline.configs.schema import TinyModelConfig, load_config
from grpo_pipeline.rewards import build_reward
from grpo_pipeline.rewards.math import after_tool_results
from grpo_pipeline.tasks.scoring.episodes import EpisodeGenerator
from grpo_pipeline.tasks.sources.tool_tasks import carry_free_sum, teacher_completion, tool_arithmetic
from grpo_pipeline.tasks.training.tiny_model import build_tokenizer

CALC = TextToolLoop("calculator", 1)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def scripted(tokenizer, script: dict[str, str]):
    """A GenerateFn that continues each row with the text `script` gives for the row's last known text (pads after)."""

    def generate(rows, max_new_tokens, criteria):
        out = []
        for row in rows:
            text = tokenizer.decode(row, skip_special_tokens=True)
            key = next(k for k in sorted(script, key=len, reverse=True) if text.endswith(k))
            new = tokenizer(script[key], add_special_tokens=False)["input_ids"]
            out.append((new + [tokenizer.pad_token_id] * max_new_tokens)[:max_new_tokens])
        return out

    return generate


def test_open_call_reads_the_expression_of_an_unanswered_call() -> None:
    assert open_call("<<12+7=") == "12+7"
    assert open_call("x<<1+2=3>>3") is None
    assert open_call("<<1+2=3>>3=") is None  # the last call is answered
    assert open_call("12+7=") is None and open_call("<<=") == ""  # an empty call: the calculator says what is wrong


def test_an_episode_inserts_the_result_masked_and_the_model_answers(tokenizer) -> None:
    eos = tokenizer.eos_token_id
    script = {"12+7=": "<<12+7=", ">>": "19</s>"}
    (episode,) = run_episodes(scripted(tokenizer, script), tokenizer, [tokenizer("12+7=")["input_ids"]], CALC,
                              max_new_tokens=30, stop=[eos])  # fmt: skip
    assert episode.text == "<<12+7=19>>19"
    assert tokenizer.decode(episode.completion_ids) == "<<12+7=19>>19</s>"
    assert episode.env_mask == [1] * 7 + [0] * 4 + [1] * 3  # "19>>" came from the tool
    assert (episode.calls, episode.errors, episode.hit_turn_limit) == (1, 0, False)


def test_a_call_past_the_turn_limit_is_not_run_and_is_counted(tokenizer) -> None:
    script = {"1+1=": "<<1+1=", ">>": "<<2+2=9</s>"}
    (episode,) = run_episodes(scripted(tokenizer, script), tokenizer, [tokenizer("1+1=")["input_ids"]], CALC,
                              max_new_tokens=30, stop=[tokenizer.eos_token_id])  # fmt: skip
    assert episode.text == "<<1+1=2>><<2+2=9"
    assert (episode.calls, episode.hit_turn_limit) == (1, True)


def test_tool_errors_and_the_budget(tokenizer) -> None:
    script = {"1+1=": "<<1^1=", ">>": "0</s>"}
    (episode,) = run_episodes(scripted(tokenizer, script), tokenizer, [tokenizer("1+1=")["input_ids"]], CALC,
                              max_new_tokens=12, stop=[tokenizer.eos_token_id])  # fmt: skip
    assert episode.errors == 1 and episode.text.startswith("<<1^1=error")
    assert len(episode.completion_ids) == 12  # the error message is cut at the budget and the episode ends
    stats = episode_stats([episode])
    assert stats == {"tools/call_frequency": 1.0, "tools/used_share": 1.0, "tools/failure_frequency": 1.0,
                     "tools/turn_limit_share": 0.0}  # fmt: skip


def test_final_answer_scores_only_the_text_after_the_last_result() -> None:
    reward = build_reward("final_answer")
    assert after_tool_results("<<1+2=3>>3") == "3" and after_tool_results("3") == "3"
    scores = reward(prompts=["1+2="] * 3, completions=["<<1+2=3>>3", "<<1+2=3>>", "3"], answer=["3"] * 3)
    assert scores == [1.0, 0.0, 1.0]  # the tool's result alone is not an answer


def test_only_one_string_tool_runs_in_text() -> None:
    assert text_tool_loop([], 1) is None
    with pytest.raises(ToolError, match=r"grpo\.tools.*set grpo\.tools=\[calculator\]"):
        text_tool_loop(["python"], 1)


def test_the_tool_teacher_is_imperfect_and_answers_stay_true() -> None:
    from grpo_pipeline.agents import text_tools
    from grpo_pipeline.tasks.sources import tool_tasks

    assert (tool_tasks.CALL_OPEN, tool_tasks.TOOL_RESULT_END) == (text_tools.CALL_OPEN, text_tools.TOOL_RESULT_END)
    assert carry_free_sum(4821, 9097) == 3818
    rng = random.Random(0)
    done = [teacher_completion("7890+5242=", rng, 5500)[1] for _ in range(400)]
    assert {"call", "wrong_call", "guess"} == set(done) and done.count("call") > done.count("guess")
    rows = tool_arithmetic(SyntheticTaskConfig(kind="tool_arithmetic", min_digits=4, max_digits=4), 200, 0)
    assert all(int(a) == sum(map(int, p[:-1].split("+"))) for p, a in zip(rows["prompt"], rows["answer"], strict=True))
    small = rows[rows["prompt"].str[0].astype(int) < 5]
    assert small["completion"].str.startswith("<<").mean() < 0.5 < rows["completion"].str.startswith("<<").mean()


def test_the_recipe_evaluates_with_the_tools_it_trains_with() -> None:
    cfg = load_config(Path(__file__).parents[1] / "configs" / "tiny-tools.yaml")
    assert cfg.eval.tools == cfg.grpo.tools == ["calculator"] and cfg.eval.max_tool_turns == cfg.grpo.max_tool_turns
    assert load_config(None).eval.tools == []


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo_pipeline.tasks.training.tiny_model import build_tiny_model

    small = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)
    return build_tiny_model(small, tmp_path_factory.mktemp("tiny") / "model", seed=0)


def test_grpo_trains_through_the_text_rollout(tiny_dir: Path, tmp_path: Path, tokenizer, monkeypatch) -> None:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    cfg = GRPOStageConfig(tools=["calculator"], max_tool_turns=1)
    kwargs = text_rollout_kwargs(cfg, tokenizer)
    seen: dict[str, list] = {}
    rollout = kwargs["rollout_func"]

    def recording_rollout(prompts, trainer):
        seen["rollout_prompts"] = list(prompts)
        return rollout(prompts, trainer)

    kwargs["rollout_func"] = recording_rollout

    def reward(prompts, completions, tool_calls, **kwargs):
        seen.update(completions=completions, tool_calls=tool_calls)
        return [float(len(c)) for c in completions]

    args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=12, report_to="none", use_cpu=True, logging_steps=1)  # fmt: skip
    data = Dataset.from_dict({"prompt": ["12+7=", "3+4="]})
    trainer = GRPOTrainer(model=str(tiny_dir), reward_funcs=reward, args=args, train_dataset=data,
                          processing_class=tokenizer, **kwargs)  # fmt: skip
    trainer.train()
    assert len(seen["completions"]) == 4 and len(seen["tool_calls"]) == 4
    # TRL hands rollout_func each prompt already repeated num_generations times (docs/agents.md), one completion each
    assert len(seen["rollout_prompts"]) == 4 and len(set(seen["rollout_prompts"])) == 1
    assert "tools/call_frequency" in trainer.state.log_history[0]


def test_evaluation_and_the_probe_run_episodes(tiny_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_pipeline.configs.schema import EvalConfig
    from grpo_pipeline.tasks.core.common import Ref
    from grpo_pipeline.tasks.scoring.evaluation import evaluate_model
    from grpo_pipeline.tasks.training.probe import greedy_correct

    rows = pd.DataFrame({"prompt": ["12+7=", "3+4="], "answer": ["19", "7"]})
    path = tmp_path / "eval.parquet"
    rows.to_parquet(path)
    cfg = EvalConfig(n_samples=2, k=[1, 2], max_new_tokens=10, tools=["calculator"], max_tool_turns=1,
                     correctness_reward="final_answer")  # fmt: skip
    result = evaluate_model(str(tiny_dir), Ref(path=str(path), fingerprint="x"), cfg, seed=0, out=tmp_path / "e")
    assert set(result.tools) >= {"tools/greedy_used_share", "tools/sampled_call_frequency"}
    assert "tools/greedy_turn_limit_share" in result.metrics()
    assert {"greedy_tool_calls", "turn_limit_hits"} <= set(result.items().columns)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)
    scores = greedy_correct(model, tokenizer, rows, build_reward("final_answer"), 10, tools=CALC)
    assert len(scores) == 2 and EpisodeGenerator  # scored through the episode loop


def test_the_sft_bar_and_the_difficulty_filter_run_episodes_with_the_recipes_tools(
    tiny_dir: Path, tmp_path: Path, tokenizer, monkeypatch
) -> None:
    from grpo_pipeline.configs.schema import SFTStageConfig
    from grpo_pipeline.flows.inputs import sft_bar
    from grpo_pipeline.tasks.core.common import Checkpoint, Ref
    from grpo_pipeline.tasks.difficulty import pass_rates
    from grpo_pipeline.tasks.scoring.rollouts import Rollouts
    from grpo_pipeline.tasks.sft import bar_probe

    cfg = load_config(Path(__file__).parents[1] / "configs" / "tiny-tools.yaml", ["sft.stop_at_accuracy=0.9"])
    bar = sft_bar(cfg, SimpleNamespace(probe=None))
    sampling = bar["probe_sampling"]
    assert (sampling.tools, sampling.max_tool_turns, sampling.temperature) == (("calculator",), 1, None)  # greedy
    rows = pd.DataFrame({"prompt": ["12+7=", "3+4="], "answer": ["19", "7"]})
    rows.to_parquet(tmp_path / "probe.parquet")
    probe = Ref(path=str(tmp_path / "probe.parquet"), fingerprint="x")
    (callback,) = bar_probe(SFTStageConfig(stop_at_accuracy=0.9), tokenizer, probe, cfg.eval.correctness_reward,
                            sampling.model_copy(update={"max_new_tokens": 10}), [])  # fmt: skip
    assert callback.tools == CALC

    rollouts = Rollouts.of(cfg)
    assert (rollouts.sampling.tools, rollouts.sampling.max_tool_turns) == (("calculator",), 1)  # episodes
    ran: list[int] = []
    episodes = TextToolLoop.episodes
    monkeypatch.setattr(TextToolLoop, "episodes", lambda self, *a, **k: ran.append(1) or episodes(self, *a, **k))
    small = Rollouts(sampling=rollouts.sampling.model_copy(update={"max_new_tokens": 10}), batch_size=4,
                     correctness_reward=rollouts.correctness_reward)  # fmt: skip
    counts = pass_rates(Checkpoint(path=str(tiny_dir), fingerprint="t"), rows, 2, small, seed=0, label="t")
    assert len(counts) == 2 and all(scored == 2 for _, scored in counts) and ran


def test_a_generator_without_stopping_criteria_pauses_at_each_equals_sign(tokenizer) -> None:
    """vLLM cannot take the text loop's StoppingCriteria: its turns pause at every token containing `=` and a row
    that opened no call it may make is continued (tasks/scoring/vllm_episodes.py), so the episode is the one a
    criterion would have cut. A stand-in engine answers each request with the next scripted piece."""
    from grpo_pipeline.tasks.scoring.vllm_episodes import turn_generator

    pieces = {"12+7=": ["x=", "<<12+7=", "19</s>"], "3+4=": ["7</s>"]}
    requests: list[str] = []

    def llm_generate(requests_: list, params: list, use_tqdm: bool) -> list:
        outs = []
        for request in requests_:
            text = tokenizer.decode(request["prompt_token_ids"], skip_special_tokens=True)
            requests.append(text)
            prompt = next(p for p in pieces if text.startswith(p))
            ids = tokenizer(pieces[prompt].pop(0), add_special_tokens=False)["input_ids"]
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids)]))
        return outs

    engine = SimpleNamespace(tokenizer=tokenizer, max_len=64, stop=[tokenizer.eos_token_id],
                             params=lambda **kw: kw, llm=SimpleNamespace(generate=llm_generate))  # fmt: skip
    generate = turn_generator(engine, temperature=None, top_p=1.0)
    prompts = [tokenizer("12+7=")["input_ids"], tokenizer("3+4=")["input_ids"]]
    (first, plain) = run_episodes(generate, tokenizer, prompts, CALC, max_new_tokens=20, stop=[tokenizer.eos_token_id])
    assert first.text == "x=<<12+7=19>>19" and (first.calls, first.errors) == (1, 0)  # paused at `x=`, went on
    assert plain.text == "7" and plain.calls == 0
    assert [r.removeprefix("12+7=") for r in requests if r.startswith("12+7=")] == ["", "x=", "x=<<12+7=19>>"]


def test_a_scripted_call_demonstrates_the_text_tool(tiny_dir: Path) -> None:
    """agents/demonstration.py on the text loop (what a rehearsal runs for a model without a tool template): the
    scripted `<<6*7=` is run by the calculator, its result appended, and the model writes on after it."""
    from transformers import AutoModelForCausalLM

    from grpo_pipeline.agents.demonstration import demonstrate, first_result, tokens_after_result
    from grpo_pipeline.tasks.core.common import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_dir))
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    greedy, stop = EpisodeGenerator(model, tokenizer, CALC).turns(max_new_tokens=64, temperature=None, top_p=1.0)
    episode = demonstrate(greedy, stop, tokenizer, CALC, "calculator")
    assert episode.text.startswith("<<6*7=42>>") and (episode.calls, episode.errors) == (1, 0)
    assert first_result(episode, tokenizer) == "42>>" and tokens_after_result(episode) >= 1


# ----------------------------------------------------------------------------- text tool calls with vLLM rollouts

TOOLS_RECIPE = Path(__file__).resolve().parents[1] / "configs" / "tiny-tools.yaml"


def test_text_tool_calls_with_vllm_rollouts_are_refused_before_sft(tmp_path, monkeypatch):
    """The text loop generates with transformers and refuses a trainer that uses vLLM (it would fail at the first
    GRPO step, after SFT): where `auto` resolves to vLLM (simulated: CUDA and the vllm package), the input checks
    that run between base_model and sft_warmup refuse it, saying what to set."""
    import grpo_pipeline.tasks.training.trainer as trainer
    from grpo_pipeline.flows.inputs import prepare_inputs
    from grpo_pipeline.tasks.model import prepare_base_model
    from grpo_pipeline.tasks.preflight import PreflightError, check_inputs

    def direct(name, stage, /, *, listed=True, **inputs):  # the stages as plain functions, without Prefect
        return stage.fn(**inputs)

    monkeypatch.setattr(trainer, "vllm_available", lambda: True)  # a CUDA machine with vLLM installed
    small = [f"run_dir={tmp_path / 'runs'}", "data.num_train=64", "data.num_eval=16", "data.num_probe=16",
             "grpo.probe_problems=16"]  # fmt: skip
    for use_vllm, refused in (("auto", True), ("true", True), ("false", False)):
        cfg = load_config(TOOLS_RECIPE, [*small, f"grpo.use_vllm={use_vllm}"])
        data = prepare_inputs(direct, cfg)[0]
        base = prepare_base_model(cfg.model, cfg.run_dir, cfg.seed)
        inputs = {"data": data, "base": base, "grpo": cfg.grpo, "eval_cfg": cfg.eval, "sft_enabled": True}
        if not refused:
            check_inputs(**inputs)
            continue
        with pytest.raises(PreflightError, match=r"grpo\.use_vllm is (auto|true)") as e:
            check_inputs(**inputs)
        assert "called in text" in str(e.value) and "set grpo.use_vllm=false" in str(e.value)


@pytest.mark.integration
def test_the_flow_stops_a_text_tool_recipe_with_vllm_before_sft(tmp_path, prefect_api):
    """The whole flow on a simulated CUDA machine with vLLM (use_vllm: auto resolves to it): the input checks stop
    it with the fix, and no SFT or GRPO checkpoint was written."""
    import subprocess
    import sys
    import textwrap

    from tests.helpers import cli_env, micro_overrides

    overrides = [*micro_overrides(tmp_path / "runs"), "grpo.use_vllm=auto"]  # the recipe itself says false
    script = textwrap.dedent(f"""
        import grpo_pipeline.tasks.training.trainer as trainer
        trainer.vllm_available = lambda: True  # CUDA and the vllm package, as on a GPU worker
        from grpo_pipeline.configs.schema import load_config
        from grpo_pipeline.flows.grpo_pipeline import grpo_pipeline
        from grpo_pipeline.tasks.preflight import PreflightError

        try:
            grpo_pipeline(config=load_config({str(TOOLS_RECIPE)!r}, {overrides!r}))
        except PreflightError as e:
            print("REFUSED", e)
    """)
    env = cli_env(tmp_path, PREFECT_API_URL=prefect_api)
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert "REFUSED" in proc.stdout and "set grpo.use_vllm=false" in proc.stdout, proc.stderr[-4000:]
    written = sorted(p.name for p in (tmp_path / "runs").glob("*"))
    assert "base" in " ".join(written) and not [n for n in written if n == "sft" or n.startswith("grpo-round")]
