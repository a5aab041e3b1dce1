"""The Llama family: cards with the published parameter counts, validation per family, GQA on every kernel."""

import pytest
import torch

from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.model_card import card_schemas
from pytest_flashckpt.models import build_model, load_card
from pytest_flashckpt.models.anatomy import check_block, get_anatomy, get_blocks

PUBLISHED = {  # the models' config.json arithmetic (vocab 128256; see the cards' comments)
    "llama3.2-1b": 1_235_814_400,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3.1-405b": 405_853_388_800,  # Meta's 405.8B
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_equal_the_published_models(name):
    card = load_card(name)
    model = build_model(card, "sdpa", "meta", torch.bfloat16)
    counted = sum(p.numel() for p in model.parameters())  # a tied head is one parameter: counted once
    assert counted == card.num_params() == PUBLISHED[name]
    anatomy = get_anatomy(model)
    assert anatomy.family == "llama"
    assert bool(anatomy.tied) == (name == "llama3.2-1b")
    if anatomy.tied:
        assert model.lm_head.weight is model.embed_tokens.weight


def test_llama_tiny_blocks_match_their_anatomy():
    model = build_model(load_card("llama-tiny"), "sdpa")
    for i, block in enumerate(get_blocks(model)):
        check_block(get_anatomy(model), block, where=f"blocks.{i}")
    assert model.blocks[0].self_attn.k_proj.out_features == 2 * 32  # 2 KV heads of 32


def test_kernels_agree_with_grouped_query_attention():
    """sdpa (enable_gqa: the CPU flash kernel takes grouped heads), the explicit CPU flash op and eager (k/v
    repeated) compute the same loss and gradients."""
    card = load_card("llama-tiny", n_layer=1)
    x = torch.randint(0, card.vocab_size, (2, 24), generator=torch.Generator().manual_seed(3))
    results = []
    for backend in ("sdpa", "sdpa-flash-cpu", "eager"):
        model = build_model(card, backend)
        loss = model(x, x)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    for loss, grads in results[1:]:
        torch.testing.assert_close(loss, results[0][0])
        for grad, ref in zip(grads, results[0][1]):
            torch.testing.assert_close(grad, ref, rtol=1e-4, atol=1e-6)


def test_a_gpt_card_with_a_llama_key_names_the_family(tmp_path):
    card = tmp_path / "odd.yaml"
    card.write_text("name: odd\nn_kv_head: 2\n")
    with pytest.raises(ConfigError, match=r"odd\.yaml: unknown key 'n_kv_head'.*belongs to the llama family.*family: llama"):
        load_card(card)
    card.write_text("name: odd\nfamily: mamba\n")
    valid = ", ".join(card_schemas())  # every registered family (gpt, llama, ...)
    with pytest.raises(ConfigError, match=rf"family: 'mamba' is not a model family \(valid: {valid}\)"):
        load_card(card)
    card.write_text("name: odd\nfamily: llama\nn_head: 6\nn_kv_head: 4\nn_embd: 192\n")
    with pytest.raises(ConfigError, match=r"n_head \(6\) must be a multiple of n_kv_head \(4\)"):
        load_card(card)
    with pytest.raises(ConfigError, match="dropout must be 0 for the llama family"):
        load_card("llama-tiny", dropout=0.1)


def test_gpt_cards_keep_their_family_default():
    assert load_card("tiny").family == "gpt"
    assert load_card("tiny", family="gpt") == load_card("tiny")


def test_tied_head_loads_from_a_state_dict_without_the_alias():
    card = load_card("llama-tiny", n_layer=1, tie_word_embeddings=True)
    source, target = build_model(card, "sdpa", seed=1), build_model(card, "sdpa", seed=2)
    state = {k: v for k, v in source.state_dict().items() if k != "lm_head.weight"}
    target.load_state_dict(state, strict=True)
    assert torch.equal(target.lm_head.weight, source.embed_tokens.weight)
    assert target.lm_head.weight is target.embed_tokens.weight
