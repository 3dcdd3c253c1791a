import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_pipeline.configs.schema import ModelConfig, TinyModelConfig
from grpo_pipeline.tasks.model import prepare_base_model
from grpo_pipeline.tasks.training.tiny_model import build_tiny_model


def test_char_tokenizer_round_trips_through_from_pretrained(tmp_path):
    path = build_tiny_model(
        TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tmp_path / "m", 0
    )
    tok = AutoTokenizer.from_pretrained(path)
    text = "Q: What's 12 + 7?\nA: 19"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character, whitespace kept
    assert tok.decode(ids) == text
    assert tok(text + tok.eos_token, add_special_tokens=False)["input_ids"][-1] == tok.eos_token_id
    assert tok.padding_side == "left"


def test_tiny_model_is_seeded_and_generates(tmp_path):
    cfg = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    a = AutoModelForCausalLM.from_pretrained(build_tiny_model(cfg, tmp_path / "a", 0))
    b = AutoModelForCausalLM.from_pretrained(build_tiny_model(cfg, tmp_path / "b", 0))
    c = AutoModelForCausalLM.from_pretrained(build_tiny_model(cfg, tmp_path / "c", 1))
    wa, wb, wc = (m.get_input_embeddings().weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    tok = AutoTokenizer.from_pretrained(tmp_path / "a")
    out = a.generate(**tok(["1+1=", "12+34="], return_tensors="pt", padding=True), max_new_tokens=3, do_sample=False)
    assert out.shape[0] == 2 and 6 < out.shape[1] <= 6 + 3


def test_base_model_from_local_directory_keeps_path(tmp_path):
    cfg = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    path = build_tiny_model(cfg, tmp_path / "mine", 0)
    ref = prepare_base_model(ModelConfig(base=str(path)), str(tmp_path / "run"), seed=0)
    assert ref.path == str(path.resolve()) and len(ref.fingerprint) == 64
    hub = prepare_base_model(ModelConfig(base="Qwen/Qwen2.5-0.5B-Instruct"), str(tmp_path / "run"), seed=0)
    assert hub.path == "Qwen/Qwen2.5-0.5B-Instruct" and hub.fingerprint.startswith("hub:")
