"""The learning-curve plot and the held-out accuracy probe."""

import pandas as pd

from grpo_pipeline.rewards import build_reward
from grpo_pipeline.tasks.scoring.curves import PROBE_METRIC, learning_curve_figure, rounds_figure
from grpo_pipeline.tasks.training.probe import greedy_accuracy


def test_learning_curve_has_every_series_and_the_sft_baseline(tmp_path):
    history = {
        "reward": [(10, 0.4), (20, 0.5), (30, 0.6)],
        "rewards/correctness/mean": [(10, 0.3), (20, 0.35), (30, 0.45)],
        PROBE_METRIC: [(0, 0.3), (30, 0.5)],
    }
    fig = learning_curve_figure(history, sft_accuracy=0.31, final_accuracy=0.48)
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert any(label.startswith("mean sampled reward") for label in labels)
    assert any(label.startswith("sampled accuracy") for label in labels)
    assert any(label.startswith("greedy accuracy, held-out probe") for label in labels)
    baseline = next(line for line in fig.axes[0].get_lines() if line.get_label().startswith("SFT"))
    assert list(baseline.get_ydata()) == [0.31, 0.31]
    fig.savefig(tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_learning_curve_without_probe_or_baseline():
    fig = learning_curve_figure({"reward": [(1, 0.1)]}, sft_accuracy=None)
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["mean sampled reward (weighted sum)"]


def test_rounds_plot_puts_each_stage_at_its_place_and_each_series_on_its_own_line(tmp_path):
    """A series that stopped early (seed 1: its round 2 returned its start) ends at round 1, not at round 2's place."""
    series = {
        "seed 0": [("SFT", 0.45), ("round 1", 0.8), ("round 2", 0.96)],
        "seed 1": [("SFT", 0.41), ("round 1", 0.9)],
    }
    fig = rounds_figure(series, "accuracy")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["SFT", "round 1", "round 2"]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["seed 0"].get_xdata()) == [0, 1, 2] and list(lines["seed 0"].get_ydata()) == [0.45, 0.8, 0.96]
    assert list(lines["seed 1"].get_xdata()) == [0, 1] and list(lines["seed 1"].get_ydata()) == [0.41, 0.9]
    fig.savefig(tmp_path / "rounds.png")
    assert (tmp_path / "rounds.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _EchoModel:
    """Stands in for a causal LM: `generate` appends fixed answer tokens to each prompt."""

    training = True
    device = "cpu"

    class generation_config:  # an attribute of the model, as on a transformers model
        eos_token_id = None

    def __init__(self, answers):
        self.answers = answers
        self.modes = []

    def eval(self):
        self.modes.append("eval")

    def train(self, mode=True):
        self.modes.append(f"train={mode}")

    def generate(self, input_ids, **kwargs):
        import torch

        assert kwargs["do_sample"] is False
        tail = torch.tensor([[ord(c) for c in a] for a in self.answers])
        return torch.cat([input_ids, tail], dim=1)


class _CharTokenizer:
    padding_side = "right"
    pad_token_id = eos_token_id = 0

    def __call__(self, text, **kwargs):
        return {"input_ids": [ord(c) for c in text]}  # one text, unpadded, as a tokenizer returns it

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["".join(chr(i) for i in row.tolist() if i) for row in ids]


def test_greedy_accuracy_scores_with_the_correctness_reward_and_restores_train_mode():
    rows = pd.DataFrame({"prompt": ["1+1=", "2+3=", "9+9="], "answer": ["2", "5", "18"]})
    model, tokenizer = _EchoModel(["2 ", "6 ", "18"]), _CharTokenizer()
    acc = greedy_accuracy(model, tokenizer, rows, build_reward("correctness"), max_new_tokens=2)
    assert acc == 2 / 3
    assert model.modes == ["eval", "train=True"]
    assert tokenizer.padding_side == "right"
