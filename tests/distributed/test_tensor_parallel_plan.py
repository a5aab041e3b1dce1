"""The tensor-parallel plan read from a block's anatomy, and the layout checks that refuse a request before
anything is built (no process group needed: plans are plain objects until ``parallelize_module`` applies them)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

from pytest_flashckpt.config.layout import Layout
from pytest_flashckpt.distributed import tensor_parallel as tp
from pytest_flashckpt.models.cards import build_model, load_card


def _meta(card: str, **overrides):
    return build_model(load_card(card, **overrides), "sdpa", "meta", torch.float32)


def test_llama_plan_shards_projections_by_role_and_norms_by_sequence() -> None:
    plan = tp.block_plan(_meta("llama-tiny", n_layer=1))
    kinds = {name: type(style) for name, style in plan.items()}
    assert kinds == {
        "input_layernorm": SequenceParallel, "post_attention_layernorm": SequenceParallel,
        "self_attn": PrepareModuleInput, "mlp": PrepareModuleInput,
        "self_attn.q_proj": ColwiseParallel, "self_attn.k_proj": ColwiseParallel, "self_attn.v_proj": ColwiseParallel,
        "mlp.gate_proj": ColwiseParallel, "mlp.up_proj": ColwiseParallel,
        "self_attn.o_proj": RowwiseParallel, "mlp.down_proj": RowwiseParallel,
    }  # fmt: skip
    root = tp.root_plan(_meta("llama-tiny", n_layer=1))
    assert [type(root[k]) for k in ("embed_tokens", "norm", "lm_head")] == [RowwiseParallel, SequenceParallel, ColwiseParallel]
    assert root["lm_head"].use_local_output is False  # vocabulary-sharded logits for loss_parallel


def test_fused_qkv_is_refused_with_the_module_named() -> None:
    with pytest.raises(ValueError, match=r"fused q/k/v projection 'attn.c_attn'.*tp 1"):
        tp.block_plan(_meta("tiny", n_layer=1))


@pytest.mark.parametrize(
    "layout,match",
    [
        (lambda: Layout(dp_shard=2, tp=0), r"tp must be a positive integer, got 0"),
        (lambda: Layout(dp_shard=2, tp=2, pp=0), r"pp must be a positive integer, got 0"),
        (lambda: Layout.for_world(8, tp=2, cp=3), r"not divisible by tp 2 x pp 1 x cp 3"),
        (lambda: Layout.for_world(6, tp=4), r"world size 6 is not divisible by tp 4"),
    ],
)
def test_bad_layouts_are_refused_naming_the_axis(layout, match) -> None:
    with pytest.raises(ValueError, match=match):
        layout()


def test_layout_checks_heads_world_and_batch() -> None:
    llama = load_card("llama-tiny")  # 6 heads over 2 key/value heads
    Layout(tp=2).check_card(llama)
    with pytest.raises(ValueError, match=r"tp 3: model card 'llama-tiny' has n_kv_head 2, not divisible by tp"):
        Layout(tp=3).check_card(llama)
    with pytest.raises(ValueError, match=r"tp 4: model card 'llama-tiny' has n_head 6"):
        Layout(tp=4).check_card(llama)
    with pytest.raises(ValueError, match=r"needs 4 ranks, the run has 2"):
        Layout(dp_shard=2, tp=2).check_world(2)
    with pytest.raises(ValueError, match=r"batch 3 is not divisible by dp_shard 2"):
        Layout(dp_shard=2, tp=2).check_batch(3)
    assert Layout.for_world(8, tp=2) == Layout(dp_shard=4, tp=2) and Layout(4, 2).world_size == 8
