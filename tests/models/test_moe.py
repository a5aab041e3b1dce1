"""The Mixture-of-Experts family: cards with the published parameter counts (total and active), counted on meta
and against Hugging Face's own Mixtral / Qwen2-MoE classes; the anatomy's expert and router roles; the routing
hook's loads (balanced, capacity) are a routing a top-k router could produce; card errors name the key."""

import math

import pytest
import torch
import torch.nn as nn

from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.cards.moe import MoEConfig
from pytest_flashckpt.models import build_model, load_card
from pytest_flashckpt.models.anatomy import check_block, get_anatomy, get_blocks, role_modules
from pytest_flashckpt.models.moe.routing import expert_tokens

# the models' config.json arithmetic (see the cards' comments), and the rounded numbers their model cards publish
PUBLISHED = {
    "mixtral-8x7b": (46_702_792_704, 12_879_925_248, "46.7", "12.9"),
    "qwen1.5-moe-a2.7b": (14_315_784_192, 2_689_173_504, "14.3", "2.7"),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_cards_have_the_published_total_and_active_parameters(name):
    total, active, total_b, active_b = PUBLISHED[name]
    card = load_card(name)
    assert (card.num_params(), card.active_params()) == (total, active)
    assert (f"{total / 1e9:.1f}", f"{active / 1e9:.1f}") == (total_b, active_b)
    two = load_card(name, n_layer=2)  # counted on meta: what the module holds is what the card says
    model = build_model(two, "sdpa", "meta", torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == two.num_params()
    assert get_anatomy(model).family == "moe"


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_two_layers_count_what_hugging_face_builds_from_the_same_config(name):
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        if name == "mixtral-8x7b":
            hf = transformers.MixtralForCausalLM(transformers.MixtralConfig(num_hidden_layers=2))
        else:  # transformers' Qwen2MoeConfig defaults are Qwen1.5-MoE-A2.7B's
            hf = transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(num_hidden_layers=2))
    assert sum(p.numel() for p in hf.parameters()) == load_card(name, n_layer=2).num_params()


def test_the_anatomy_names_the_router_and_every_expert():
    card = load_card("moe-tiny")
    model = build_model(card, "sdpa", "meta")
    anatomy = get_anatomy(model)
    block = get_blocks(model)[0]
    for i, b in enumerate(get_blocks(model)):
        check_block(anatomy, b, where=f"blocks.{i}")
    ups = role_modules(block, anatomy.block.projections["expert_up"])
    assert [name for name, _ in ups] == [f"mlp.experts.{e}.up_proj" for e in range(card.n_experts)]
    assert anatomy.block.role_of("mlp.experts.4.down_proj") == "expert_down"
    assert anatomy.block.role_of("mlp.gate") == "router"
    assert anatomy.block.role_of("mlp.shared_expert.up_proj") == "up"
    assert anatomy.block.role_of("mlp.shared_expert_gate") == "shared_expert_gate"
    block.mlp.experts[3].extra = nn.Linear(4, 4)  # control: a Linear inside an expert without a role
    with pytest.raises(ValueError, match=r"blocks\.0 \(Block\) does not match its anatomy.*without a role: mlp\.experts\.3\.extra"):
        check_block(anatomy, block, where="blocks.0")


@pytest.mark.parametrize("routing", ["balanced", "capacity"])
@pytest.mark.parametrize("tokens", [7, 48, 256])
def test_forced_routing_gives_every_token_top_k_distinct_experts(routing, tokens):
    card = load_card("moe-tiny", routing=routing)
    loads = card.expert_loads(tokens)
    indices = expert_tokens(card, torch.empty(tokens, card.top_k, dtype=torch.long), tokens)
    assert [len(i) for i in indices] == loads and sum(loads) == tokens * card.top_k
    per_token = torch.zeros(tokens, dtype=torch.long)
    for idx in indices:
        assert len(set(idx.tolist())) == len(idx)  # an expert sees a token once
        per_token[idx] += 1
    assert per_token.tolist() == [card.top_k] * tokens
    balanced = tokens * card.top_k / card.n_experts
    if routing == "balanced":
        assert max(loads) - min(loads) <= 1
    else:  # the hottest experts are full at capacity_factor x the balanced load
        assert max(loads) == min(tokens, math.ceil(card.capacity_factor * balanced)) > math.ceil(balanced)


def test_learned_routing_follows_the_router_and_refuses_meta():
    card = load_card("moe-tiny", routing="learned")
    selected = torch.tensor([[0, 1], [1, 5], [5, 0]])
    assert [i.tolist() for i in expert_tokens(card, selected, 3)] == [[0, 2], [0, 1], [], [], [], [1, 2]]
    with pytest.raises(ValueError, match="routing: learned dispatches tokens by their values.*routing: balanced"):
        expert_tokens(card, selected.to("meta"), 3)
    torch.manual_seed(0)
    model = build_model(card, "sdpa")  # a real step routes by the data
    x = torch.randint(0, card.vocab_size, (2, 16))
    assert torch.isfinite(model(x, x))


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [("top_k", 7, r"top_k \(7\) must be at most n_experts \(6\)"),
     ("capacity_factor", 0.5, r"capacity_factor must be in \[1, n_experts / top_k = 3\]"),
     ("routing", "random", r"routing"),
     ("shared_expert_intermediate_size", 0, r"shared_expert_gate needs a shared expert")],
)
def test_card_errors_name_the_file_and_the_key(tmp_path, key, value, match):
    good = {"name": "odd", "family": "moe", "n_experts": 6, "top_k": 2, "shared_expert_intermediate_size": 8,
            "shared_expert_gate": "true", "routing": "capacity", "capacity_factor": 2.0}
    card = tmp_path / "odd.yaml"
    card.write_text("".join(f"{k}: {v}\n" for k, v in {**good, key: value}.items()))
    with pytest.raises(ConfigError, match=rf"odd\.yaml.*{match}"):
        load_card(card)
    card.write_text("".join(f"{k}: {v}\n" for k, v in good.items()))  # control: the same card without the bad value
    assert isinstance(load_card(card), MoEConfig)


def test_a_llama_card_with_an_expert_key_names_the_moe_family(tmp_path):
    card = tmp_path / "odd.yaml"
    card.write_text("name: odd\nfamily: llama\nn_experts: 8\n")
    with pytest.raises(ConfigError, match=r"unknown key 'n_experts'.*belongs to the moe family.*family: moe"):
        load_card(card)
