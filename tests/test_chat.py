"""Chat-formatted prompts (data.prompt_format: chat): message building, the data contract, the tiny tokenizer's chat
template, rewards on conversational completions, evaluation's rendering, and the whole pipeline through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.data_utils import is_conversational

from grpo_pipeline.configs.schema import ConfigError, DataConfig, TinyModelConfig, load_config
from grpo_pipeline.rewards import build_reward
from grpo_pipeline.tasks.core import chat
from grpo_pipeline.tasks.data import prepare_data
from grpo_pipeline.tasks.scoring.generation import generate
from grpo_pipeline.tasks.scoring.items import reward_scores
from grpo_pipeline.tasks.sources import DataError
from grpo_pipeline.tasks.sources.contract import CHAT_CHECK, DataValidationError, validate_frames
from grpo_pipeline.tasks.sources.tables import map_columns
from grpo_pipeline.tasks.training.tiny_model import CHARACTERS, SPECIAL_TOKENS, build_tiny_model, build_tokenizer
from grpo_pipeline.tasks.training.trainer import load_split
from tests.helpers import cli_env, micro_overrides, run_cli

SYSTEM = "Add the numbers."
TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def chat_data(**kw: object) -> DataConfig:
    extra = {"prompt_format": "chat", "system_prompt": SYSTEM, "num_train": 40, "num_eval": 10, **kw}
    return load_config(None, [f"data.{k}={'null' if v is None else v}" for k, v in extra.items()]).data


def messages(question: str, system: str | None = SYSTEM) -> str:
    return chat.encode_messages(chat.build_messages(question, system))


# ----------------------------------------------------------------------------- config and data


def test_system_prompt_needs_chat_format() -> None:
    with pytest.raises(ConfigError, match=r"data\.prompt_format=chat"):
        load_config(None, [f"data.system_prompt={SYSTEM}"])
    assert load_config(None, ["data.prompt_format=chat"]).data.system_prompt is None


def test_synthetic_chat_prompts_are_system_then_templated_user(tmp_path: Path) -> None:
    cfg = chat_data(prompt_template="'Q: {prompt}'")
    refs = prepare_data(cfg, str(tmp_path))
    train = pd.read_parquet(refs.train.path)
    text = pd.read_parquet(prepare_data(chat_data(prompt_format="text", system_prompt=None), str(tmp_path)).train.path)
    assert train["prompt"].map(type).eq(str).all()  # stored as JSON text: the split and validation work on strings
    for stored, answer in zip(train["prompt"], train["answer"], strict=True):
        system, user = chat.decode_messages(stored)
        assert system == {"role": "system", "content": SYSTEM}
        assert user["role"] == "user" and user["content"].startswith("Q: ") and user["content"].endswith("=")
        a, b = user["content"][3:-1].split("+")
        assert int(a) + int(b) == int(answer)
    # the same problems in text form: only the prompt's form changes
    assert [chat.preview(p) for p in train["prompt"]] == [f"Q: {p}" for p in text["prompt"]]
    assert text["prompt"].map(chat.decode_messages).isna().all()
    validate_frames(train, pd.read_parquet(refs.eval.path), cfg)


def test_source_messages_are_kept_and_text_mode_refuses_them() -> None:
    own_system = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "3+3="}]
    raw = pd.DataFrame(
        {
            "prompt": [[{"role": "user", "content": "2+2="}], own_system],
            "answer": ["4", "6"],
            "completion": [[{"role": "assistant", "content": "4"}], "6"],
        }
    )
    cfg = chat_data(completion_column="completion")
    out = map_columns(raw, cfg, origin="data file x.jsonl")
    assert [chat.decode_messages(p) for p in out["prompt"]] == [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "2+2="}],
        own_system,  # its own system message is kept
    ]
    assert out["completion"].tolist() == ["4", "6"]  # an assistant message's content is the SFT target
    with pytest.raises(DataError, match=r"x.jsonl: column 'prompt' holds chat messages.*prompt_format=chat"):
        map_columns(raw, chat_data(prompt_format="text", system_prompt=None), origin="data file x.jsonl")


def test_sft_targets_are_read_as_the_rewards_read_a_completion() -> None:
    # one rule for a completion's text (rewards.completion_text): a lone message gives its content, not its repr;
    # a number stays its str; a list that is not chat messages is refused, naming the file and the column
    raw = pd.DataFrame(
        {
            "prompt": ["2+2=", "3+3=", "4+4="],
            "answer": ["4", "6", "8"],
            "completion": [{"role": "assistant", "content": "4"}, 6, [{"role": "assistant", "content": "8"}]],
        }
    )
    out = map_columns(raw, chat_data(completion_column="completion"), origin="data file x.jsonl")
    assert out["completion"].tolist() == ["4", "6", "8"]
    raw["completion"] = [["4"], "6", "8"]
    with pytest.raises(DataError, match=r"x.jsonl: column 'completion' holds \['4'\], which is neither text"):
        map_columns(raw, chat_data(completion_column="completion"), origin="data file x.jsonl")


@pytest.mark.parametrize(
    ("bad_prompt", "problem"),
    [
        ("not json at all", "is not JSON chat messages"),
        ('[{"role": "user"}]', "message 0 is not an object with 'role' and 'content'"),
        ('[{"role": "robot", "content": "2+2="}]', "message 0 has role 'robot'"),
        ('[{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]', "the last message is from"),
        ('[{"role": "system", "content": "x"}, {"role": "user", "content": "  "}]', "message 1 (user) has no text"),
        ("[]", "is not a non-empty list of messages"),
    ],
)
def test_validation_names_each_malformed_chat_row(bad_prompt: str, problem: str) -> None:
    train = pd.DataFrame({"prompt": [messages("1+1="), bad_prompt], "answer": ["2", "4"], "completion": ["2", "4"]})
    held_out = pd.DataFrame({"prompt": [messages("5+5=")], "answer": ["10"], "completion": ["10"]})
    with pytest.raises(DataValidationError) as err:
        validate_frames(train, held_out, chat_data())
    assert f"train row 1: column 'prompt' failed '{CHAT_CHECK}': {problem}" in str(err.value), err.value
    assert "row 0" not in str(err.value)
    validate_frames(train.head(1), held_out, chat_data())  # the good rows alone pass


def test_chat_length_bounds_and_duplicates_read_the_content() -> None:
    train = pd.DataFrame(
        {
            "prompt": [messages("1+1="), messages(" 1+1=  "), messages("x" * 90)],
            "answer": ["2", "2", "3"],
            "completion": ["2", "2", "3"],
        }
    )
    held_out = pd.DataFrame({"prompt": [messages("1 +1=")], "answer": ["2"], "completion": ["2"]})
    # the JSON of a short prompt is ~80 characters; the bound applies to its content (16 + 4 characters)
    cfg = chat_data(max_prompt_chars=60)
    with pytest.raises(DataValidationError) as err:
        validate_frames(train, held_out, cfg)
    text = str(err.value)
    assert "train row 1: failed 'no_duplicate_prompts_within_split'" in text  # the same question, other spacing
    assert "train row 2: column 'prompt' failed 'chat_content_length'" in text  # 16 + 90 characters > 60
    assert "train row 0" not in text and "eval row 0" not in text  # "1 +1=" is another question
    validate_frames(train.head(1), held_out, cfg)


# ----------------------------------------------------------------------------- the tiny tokenizer's template


def test_tiny_chat_template_round_trips_through_from_pretrained(tmp_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(build_tiny_model(TINY, tmp_path / "m", 0))
    assert len(tok) == len(SPECIAL_TOKENS) + len(CHARACTERS)  # the template needs no new token: same weights shape
    prompt = chat.decode_messages(messages("12+7="))
    rendered = chat.render_prompt(tok, messages("12+7="))
    assert rendered == f"<|system|>{SYSTEM}\n<|user|>12+7=\n<|assistant|>"
    assert chat.render_prompt(tok, rendered) == rendered  # rendering twice changes nothing
    assert chat.render_prompt(tok, "12+7=") == "12+7="  # text prompts are fed as they are
    full = tok.apply_chat_template([*prompt, {"role": "assistant", "content": "19"}], tokenize=False)
    assert full == rendered + "19" + tok.eos_token  # the prompt is a prefix: SFT trains on "19" + EOS
    ids = tok(full, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(rendered) + 3 and ids[-1] == tok.eos_token_id and tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == rendered + "19"
    # what TRL's GRPOTrainer tokenizes for a conversational prompt is the same text, token for token
    trl_ids = tok.apply_chat_template([prompt], add_generation_prompt=True, tokenize=True, return_dict=True)
    assert trl_ids["input_ids"][0] == tok(rendered, add_special_tokens=False)["input_ids"]


def test_a_tokenizer_without_template_is_refused_with_the_fix() -> None:
    tok = build_tokenizer()
    tok.chat_template = None
    with pytest.raises(chat.ChatTemplateError, match=r"no chat template.*data\.prompt_format=text"):
        chat.render_prompt(tok, messages("1+1="))
    assert chat.render_prompt(tok, "1+1=") == "1+1="


def test_input_check_counts_rendered_prompts_and_refuses_a_model_without_template(tmp_path: Path) -> None:
    from grpo_pipeline.configs.schema import EvalConfig, GRPOStageConfig
    from grpo_pipeline.tasks.core.common import Checkpoint
    from grpo_pipeline.tasks.core.context_window import context_problems

    path = build_tiny_model(TINY, tmp_path / "m", 0)  # 128 positions
    rows = pd.DataFrame({"prompt": [messages("12+7=")], "answer": ["19"], "completion": ["19"]})
    base = Checkpoint(path=str(path), fingerprint="f")
    problems, context, longest = context_problems(base, rows, rows, GRPOStageConfig(), EvalConfig(), True)
    assert problems == [] and context == 128
    assert longest == len(f"<|system|>{SYSTEM}\n<|user|>12+7=\n<|assistant|>")  # what the model reads, not the JSON
    (path / "chat_template.jinja").unlink()
    problems, _, _ = context_problems(base, rows, rows, GRPOStageConfig(), EvalConfig(), True)
    assert len(problems) == 1 and "has no chat template" in problems[0] and "data.prompt_format=text" in problems[0]


def test_training_splits_become_trl_conversational(tmp_path: Path) -> None:
    refs = prepare_data(chat_data(), str(tmp_path))
    tok = build_tokenizer()
    sft = chat.conversational_dataset(load_split(Path(refs.train.path), ["prompt", "completion"]), tok, "tiny")
    row = sft[0]
    assert is_conversational(row) and is_conversational({"prompt": row["prompt"]})
    assert row["prompt"][0] == {"role": "system", "content": SYSTEM} and row["prompt"][-1]["role"] == "user"
    assert row["completion"] == [{"role": "assistant", "content": pd.read_parquet(refs.train.path)["completion"][0]}]
    grpo = chat.conversational_dataset(load_split(Path(refs.train.path)).remove_columns("completion"), tok, "tiny")
    assert is_conversational(grpo[0]) and "completion" not in grpo.column_names and grpo[0]["answer"]
    text = load_split(Path(prepare_data(chat_data(prompt_format="text", system_prompt=None), str(tmp_path)).train.path))
    assert chat.conversational_dataset(text, tok, "tiny") is text


# ----------------------------------------------------------------------------- rewards and evaluation


REWARDS = [
    ("correctness", {}),
    ("digit_match", {}),
    ("format", {"pattern": r"^-?\d+$"}),
    ("format_soft", {}),
    ("tag_count", {}),
    ("length", {}),
    ("cosine_length", {"max_len": 10}),
    ("repetition_penalty", {"ngram_size": 1}),
    ("overlong", {"max_len": 3, "cache_len": 1}),
]


@pytest.mark.parametrize(("name", "params"), REWARDS, ids=[n for n, _ in REWARDS])
def test_rewards_score_conversational_completions_like_text(name: str, params: dict) -> None:
    """GRPOTrainer hands a chat run's rewards message prompts and `[{"role": "assistant", ...}]` completions; every
    reward must score them as it scores the same text."""
    texts = ["19", "18", " 19 19 19", "<reasoning>\n12+7\n</reasoning>\n<answer>\n19\n</answer>"]
    answers = ["19"] * len(texts)
    prompts = [chat.decode_messages(messages("12+7="))] * len(texts)
    fn = build_reward(name, params)
    as_text = fn(prompts=["12+7="] * len(texts), completions=texts, answer=answers)
    completions = [chat.as_completion(p, t) for p, t in zip(prompts, texts, strict=True)]
    as_chat = fn(prompts=prompts, completions=completions, answer=answers)
    assert as_chat == as_text
    assert len(set(as_text)) > 1  # the inputs tell the completions apart


def test_code_reward_builds_the_program_from_the_user_message(code_sandbox: None) -> None:
    """HumanEval style: the program is the prompt + the completion; for a chat prompt, the user message's code."""
    stub = 'def add(a, b):\n    """Add two numbers."""\n'
    prompt = chat.decode_messages(messages(stub, system="Complete the function."))
    columns = {"test": ["def check(candidate):\n    assert candidate(2, 3) == 5\n"] * 2, "entry_point": ["add"] * 2}
    fn = build_reward("code_tests")
    completions = [chat.as_completion(prompt, "    return a + b\n"), chat.as_completion(prompt, "    return a - b\n")]
    assert fn(prompts=[prompt, prompt], completions=completions, **columns) == [1.0, 0.0]


def test_eval_renders_chat_prompts_and_gives_rewards_messages(tmp_path: Path) -> None:
    path = build_tiny_model(TINY, tmp_path / "m", 0)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    stored = [messages("12+7="), messages("3+40=")]
    rendered = [chat.render_prompt(tok, p) for p in stored]
    settings = {"max_new_tokens": 4, "batch_size": 2}
    # generate renders a stored chat prompt itself: the same greedy text as from the rendered prompt
    assert generate(model, tok, stored, **settings) == generate(model, tok, rendered, **settings)
    assert generate(model, tok, stored, **settings) != generate(model, tok, ["12+7=", "3+40="], **settings)

    seen: list[tuple] = []

    def record(prompts, completions, answer, **kwargs) -> list[float]:
        seen.extend(zip(prompts, completions, answer, strict=True))
        return [0.0] * len(completions)

    rows = pd.DataFrame({"prompt": stored, "answer": ["19", "43"], "completion": ["19", "43"]})
    assert reward_scores(record, rows, [["19", "x"], ["43", "y"]]) == [[0.0, 0.0], [0.0, 0.0]]
    assert seen[0] == (chat.decode_messages(stored[0]), [{"role": "assistant", "content": "19"}], "19")
    assert seen[3] == (chat.decode_messages(stored[1]), [{"role": "assistant", "content": "y"}], "43")


# ----------------------------------------------------------------------------- the whole pipeline

PROBE_REWARD = '''
import json, os


def seen(prompts, completions, **kwargs):
    """Records what a reward is handed (weight 0: it changes no advantage)."""
    with open(os.environ["CHAT_PROBE_LOG"], "a") as f:
        for p, c in zip(prompts, completions):
            f.write(json.dumps({"prompt": p, "completion": c}) + "\\n")
    return [0.0] * len(completions)
'''


@pytest.mark.integration
@pytest.mark.slow
def test_chat_pipeline_through_the_cli(tmp_path: Path, prefect_api: str) -> None:
    """A micro run with chat prompts: SFT and GRPO tokenize the rendered template (MLflow `num_tokens` per
    sequence is far above what the bare prompts have), GRPO's rewards get messages, the eval keeps the rendered
    prompt, and the round is registered."""
    (tmp_path / "chatprobe.py").write_text(PROBE_REWARD)
    log = tmp_path / "rewards.jsonl"
    summary_path = tmp_path / "summary.json"
    overrides = micro_overrides(tmp_path / "runs")
    args = [
        "run",
        "--summary-json",
        str(summary_path),
        *overrides,
        "name=micro-chat",
        "registry.model_name=micro-chat",
        "data.prompt_format=chat",
        f"data.system_prompt={SYSTEM}",
        f"code_dir={tmp_path}",
        "grpo.rewards=[{name: correctness}, {name: format, weight: 0.2}, {name: 'chatprobe:seen', weight: 0.0}]",
    ]
    proc = run_cli(args, cli_env(tmp_path, CHAT_PROBE_LOG=str(log), PREFECT_API_URL=prefect_api), timeout=400)
    assert proc.returncode == 0, f"pipeline failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    summary = json.loads(summary_path.read_text())
    (reg,) = summary["registrations"]
    assert (reg["model_name"], reg["version"], reg["alias"]) == ("micro-chat", "1", "champion")

    cfg = load_config(None, overrides)
    # the shortest templated prompt: "<|system|>Add the numbers.\n<|user|>1+1=\n<|assistant|>" (54 tokens); a bare
    # default prompt has at most 6, plus a completion of at most 3 (SFT) or max_completion_tokens (GRPO)
    floor = len(chat.render_prompt(build_tokenizer(), messages("1+1=")))
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    client = mlflow.MlflowClient()
    runs = {r.info.run_name: r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])}
    sft_tokens = runs["micro-chat-sft"].data.metrics["num_tokens"]
    grpo_tokens = runs["micro-chat-grpo-round1"].data.metrics["num_tokens"]
    sft_sequences = cfg.sft.max_steps * cfg.sft.batch_size
    grpo_sequences = cfg.grpo.steps_per_round * cfg.grpo.prompts_per_step * cfg.grpo.generations_per_prompt
    assert sft_tokens / sft_sequences > floor, (sft_tokens, sft_sequences)
    assert grpo_tokens / grpo_sequences > floor, (grpo_tokens, grpo_sequences)

    # GRPO handed the rewards message prompts and assistant-message completions (the eval's calls do the same)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    from_grpo = [c for c in calls if isinstance(c["completion"], list)]
    assert len(from_grpo) >= grpo_sequences
    assert all(c["prompt"][0] == {"role": "system", "content": SYSTEM} for c in calls)
    assert all(c["completion"][0]["role"] == "assistant" for c in from_grpo)

    # the eval rendered the template before generating, and kept what the model read
    (items_file,) = (tmp_path / "runs").glob("eval-r1/*/items.jsonl")
    items = [json.loads(line) for line in items_file.read_text().splitlines()]
    assert len(items) == cfg.data.num_eval
    for item in items:
        question = chat.preview(item["prompt"])
        assert item["prompt_text"] == f"<|system|>{SYSTEM}\n<|user|>{question}\n<|assistant|>"
