"""Discovery with the public import alone: ``from pytest_flashckpt.activation import apply_ac`` (or the checkpoint
API, for a layer-wise save) is all a user of a transformers model imports (the Hugging Face discoverer is registered with the package, lazily: transformers is not
imported until a transformers model is met); blocks in an ``nn.ModuleList``, an ``nn.ModuleDict`` (torchtitan's
``layers``) or a plain list; and when nothing knows a model, the error names its block containers and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models import anatomy as anatomy_module
from pytest_flashckpt.models.anatomy import BlockAnatomy, ModelAnatomy, get_anatomy, get_blocks

ROOT = Path(__file__).resolve().parents[2]

PUBLIC_IMPORT_ONLY = """
import sys
from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.config.scenario import ActivationConfig
assert "transformers" not in sys.modules, "importing the package imported transformers"
assert "pytest_flashckpt.models.hf" not in sys.modules
import transformers
none = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32, **none))
llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
    num_key_value_heads=2, intermediate_size=48, vocab_size=64, max_position_embeddings=32, **none))
import tempfile
from pathlib import Path
from pytest_flashckpt.checkpoint import Checkpointer
from pytest_flashckpt.config.scenario import SaveConfig
from pytest_flashckpt.training import Trainer
for model in (gpt2, llama):
    with tempfile.TemporaryDirectory() as root:
        with Checkpointer(root, SaveConfig(strategy="layerwise", format="safetensors")) as ckpt:
            record = ckpt.save(Trainer.create(model, batch_size=1, seq_len=8))
        files = sorted(p.name for p in (Path(root) / record.name / "layers").iterdir())
    print(type(model).__name__, "layerwise", files)
    print(type(model).__name__, apply_ac(model, ActivationConfig(strategy="selective_op")).describe())
"""


@pytest.mark.slow
def test_a_user_built_transformers_model_needs_only_the_public_import() -> None:
    pytest.importorskip("transformers", reason="Hugging Face models need the optional extra pytest-flashckpt[hf]")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", PUBLIC_IMPORT_ONLY], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "GPT2LMHeadModel selective_op on blocks 0, 1" in run.stdout
    for name in ("GPT2LMHeadModel", "LlamaForCausalLM"):
        assert f"{name} layerwise ['block_000.safetensors', 'block_001.safetensors', 'rest.safetensors']" in run.stdout
    assert "LlamaForCausalLM selective_op on blocks 0, 1" in run.stdout


def test_control_without_the_registered_discoverer_the_error_names_the_blocks_and_the_fix(monkeypatch) -> None:
    """What a user met before: no discoverer knows the model. The error now names where its blocks are."""
    transformers = pytest.importorskip("transformers", reason="Hugging Face models need the optional extra pytest-flashckpt[hf]")
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                                                 n_positions=32, bos_token_id=None, eos_token_id=None))
    assert get_anatomy(model).family == "hf-gpt2"
    monkeypatch.setattr(anatomy_module, "_DISCOVERERS", [])
    with pytest.raises(ValueError, match=r"no anatomy for a GPT2LMHeadModel.*Its block containers: transformer\.h "
                                         r"\(ModuleList of 2\).*apply_ac\(\.\.\., blocks='transformer\.h'\)"):
        get_anatomy(model)
    applied = apply_ac(model, ActivationConfig(strategy="full"), blocks="transformer.h")  # the fix the error names
    assert applied.blocks == (0, 1)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.attn = nn.Identity()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class DictModel(nn.Module):
    """Blocks in an ``nn.ModuleDict``, as torchtitan keeps ``layers``."""

    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(n)})
        self.head = nn.Linear(8, 16)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens)
        for layer in self.layers.values():
            h = layer(h)
        return self.head(h)


class StatedDictModel(DictModel):
    def anatomy(self) -> ModelAnatomy:
        return ModelAnatomy("custom", "layers", BlockAnatomy({"up": "up", "down": "down"}, "attn", ("norm",)), ("emb",), "head")


def loss_and_grads(model: nn.Module):
    torch.manual_seed(0)
    tokens = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(1))
    model(tokens).square().mean().backward()
    return {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("given", ["path", "moduledict", "list", "anatomy"])
def test_blocks_in_a_moduledict_or_a_list_are_wrapped_in_order(given: str) -> None:
    torch.manual_seed(0)
    reference = loss_and_grads(DictModel())
    torch.manual_seed(0)
    model = StatedDictModel() if given == "anatomy" else DictModel()
    blocks = {"path": "layers", "moduledict": model.layers, "list": list(model.layers.values()), "anatomy": None}[given]
    applied = apply_ac(model, ActivationConfig(strategy="every_k", k=2), blocks=blocks)
    assert applied.blocks == (0, 2)
    assert "forward" in model.layers["0"].__dict__ and "forward" not in model.layers["1"].__dict__
    grads = loss_and_grads(model)
    assert [n for n in grads if not torch.equal(grads[n], reference[n])] == []


def test_an_anatomy_naming_a_moduledict_gives_its_values_in_order() -> None:
    model = StatedDictModel()
    assert get_blocks(model) == list(model.layers.values())
    model.layers = nn.ModuleDict()
    with pytest.raises(ValueError, match=r"names blocks 'layers', which is an empty ModuleDict, not a non-empty"):
        get_blocks(model)


@pytest.mark.parametrize("blocks, message", [
    ("nope", r"blocks='nope': a DictModel has no submodule 'nope'; name the container of its decoder blocks"),
    (nn.ModuleDict(), r"must be a non-empty nn\.ModuleList, nn\.ModuleDict or list .* got an empty ModuleDict"),
    ([], r"got an empty list"),
    ("head", r"got Linear"),
    ([1, 2], r"got list"),
])
def test_bad_blocks_are_refused_naming_what_was_given(blocks, message: str) -> None:
    model = DictModel()
    with pytest.raises(ValueError, match=message):
        apply_ac(model, ActivationConfig(strategy="full"), blocks=blocks)
    assert "forward" not in model.layers["0"].__dict__  # nothing was wrapped


def test_without_blocks_a_moduledict_model_is_told_its_containers() -> None:
    with pytest.raises(ValueError, match=r"Its block containers: layers \(ModuleDict of 3\).*blocks='layers'"):
        apply_ac(DictModel(), ActivationConfig(strategy="full"))
    assert apply_ac(DictModel(), ActivationConfig(strategy="full"), blocks="layers").blocks == (0, 1, 2)  # control
