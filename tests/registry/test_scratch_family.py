"""A family is its folder and its card schema: a scratch family written to a temporary folder registers itself (no
central list edited), shows up in ``flashckpt simulate --model``'s families, builds from its card and simulates."""

from __future__ import annotations

import sys
import textwrap

import pytest

from pytest_flashckpt.cli import main as flashckpt
from pytest_flashckpt.config import model_card
from pytest_flashckpt.models import build_model, families, load_card  # families: the module

CARD_SCHEMA = '''
from dataclasses import dataclass


@dataclass(frozen=True)
class WideConfig:
    """A scratch family whose card uses the neutral names as its own keys."""

    name: str = "custom"
    description: str = ""
    family: str = "wide"
    vocab_size: int = 64
    num_blocks: int = 2
    width: int = 32
    num_heads: int = 2
    max_seq_len: int = 32
    dropout: float = 0.0
    allocate_on_cpu: bool = True

    @property
    def mlp_width(self) -> int:
        return 4 * self.width

    def gpt(self):
        from pytest_flashckpt.config.cards.gpt import GPTConfig  # a card schema imports only the config layer

        return GPTConfig(name=self.name, vocab_size=self.vocab_size, block_size=self.max_seq_len,
                         n_layer=self.num_blocks, n_head=self.num_heads, n_embd=self.width)

    def num_params(self) -> int:
        return self.gpt().num_params()


CARD = WideConfig
'''

FAMILY = '''
from dataclasses import replace

from pytest_flashckpt.models.families import Family, register_family
from pytest_flashckpt.models.gpt import GPT, GPT_ANATOMY
from scratch_cards.wide import WideConfig


class Wide(GPT):
    def anatomy(self):
        return replace(GPT_ANATOMY, family="wide")


FAMILY = register_family(Family(name="wide", card=WideConfig, build=lambda card, backend: Wide(card.gpt(), backend),
                                anatomy=lambda card: replace(GPT_ANATOMY, family="wide")))
'''


@pytest.fixture
def scratch_family(tmp_path, monkeypatch):
    """``scratch_cards/wide.py`` (the card schema) and ``scratch_models/wide/family.py`` (the family) under a
    temporary folder, discovered as the project's own are; the registries are restored afterwards."""
    (tmp_path / "scratch_cards").mkdir()
    (tmp_path / "scratch_cards" / "__init__.py").write_text("")
    (tmp_path / "scratch_cards" / "wide.py").write_text(textwrap.dedent(CARD_SCHEMA))
    (tmp_path / "scratch_models" / "wide").mkdir(parents=True)
    (tmp_path / "scratch_models" / "__init__.py").write_text("")
    (tmp_path / "scratch_models" / "wide" / "__init__.py").write_text("")
    (tmp_path / "scratch_models" / "wide" / "family.py").write_text(textwrap.dedent(FAMILY))
    (tmp_path / "scratch_models" / "helpers").mkdir()  # a folder without family.py is not a family
    (tmp_path / "scratch_models" / "helpers" / "__init__.py").write_text("raise AssertionError('imported')")
    card = tmp_path / "wide-tiny.yaml"
    card.write_text("name: wide-tiny\nfamily: wide\nnum_blocks: 3\nwidth: 32\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(model_card, "_SCHEMAS", dict(model_card._SCHEMAS))
    monkeypatch.setattr(families, "_FAMILIES", dict(families.families()))
    monkeypatch.setattr(families, "_DISCOVERED", list(families._DISCOVERED))
    yield tmp_path, card
    for name in [m for m in sys.modules if m.split(".")[0] in ("scratch_cards", "scratch_models")]:
        del sys.modules[name]


def help_text(capsys) -> str:
    return " ".join(capsys.readouterr().out.split())  # argparse wraps the help to the terminal's width


def test_a_scratch_family_registers_itself_and_builds(scratch_family, capsys):
    folder, card_file = scratch_family
    before = ", ".join(model_card.card_schemas())  # gpt, llama, ...
    with pytest.raises(SystemExit):
        flashckpt(["simulate", "--help"])
    assert f"of a family: {before} (default" in help_text(capsys)  # control: not there before discovery
    model_card.discover_card_schemas("scratch_cards", [str(folder / "scratch_cards")])
    families.discover_families("scratch_models", [str(folder / "scratch_models")])
    assert set(families.families()) == {*before.split(", "), "wide"}
    with pytest.raises(SystemExit):
        flashckpt(["simulate", "--help"])
    assert f"of a family: {before}, wide (default" in help_text(capsys)
    card = load_card(str(card_file))
    model = build_model(card, "sdpa")
    assert type(model).__name__ == "Wide" and len(model.blocks) == 3 and model.anatomy().family == "wide"
    status = flashckpt(["simulate", "--model", str(card_file), "--seq", "16", "--batch", "2", "--dtype", "fp32",
                        "--target", "cpu", "--kernel", "sdpa", "--strategy", "full"])
    assert status == 0 and "wide-tiny, " in capsys.readouterr().out


def test_a_family_whose_card_schema_is_not_registered_is_refused():
    from pytest_flashckpt.models.gpt import GPTConfig

    with pytest.raises(ValueError, match=r"model family 'moe': its card schema GPTConfig is not the one .*config/cards/moe.py"):
        families.register_family(families.Family("moe", GPTConfig, build=None, anatomy=None))
