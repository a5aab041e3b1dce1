"""``tensor_parallel.settle_embedding_output`` (issue 32 item 7): under tensor parallel the token embedding hands the
first block an ``AsyncCollectiveTensor`` (its reduce-scatter still in flight), which a compiled block's backward
mishandles (reports/spike-compiled-layouts.md: the compiled TP row fails in ``Redistribute.backward`` without it and
trains to the eager loss with it). Here, on torch's fake process group in one process (no collective runs; shapes,
types and autograd are real): with the hook the first block reads a plain tensor and the embedding still gets its
gradient; without it (the control) the block reads the asynchronous one."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel
from torch.testing._internal.distributed.fake_pg import FakeStore

from pytest_flashckpt.distributed import tensor_parallel as tp
from pytest_flashckpt.models.anatomy import get_anatomy, get_blocks
from pytest_flashckpt.models.cards import build_model, load_card


@pytest.fixture
def tp_mesh():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    finally:
        dist.destroy_process_group()


def _first_block_input_and_embedding_grad(mesh, settle: bool) -> tuple[type, torch.Tensor | None]:
    model = build_model(load_card("llama-tiny"), "sdpa", "cpu", torch.float32, seed=1)
    tp.apply_tp(model, mesh)
    if settle:
        tp.settle_embedding_output(model)
    seen: list[type] = []
    get_blocks(model)[0].register_forward_pre_hook(lambda module, args: seen.append(type(args[0])))
    tokens = torch.randint(0, 100, (2, 32))
    with loss_parallel():
        logits = model(tokens)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    embedding = model.get_submodule(get_anatomy(model).embeddings[0])
    return seen[0], embedding.weight.grad


def test_the_first_block_reads_a_plain_tensor_and_the_embedding_still_trains(tp_mesh) -> None:
    kind, grad = _first_block_input_and_embedding_grad(tp_mesh, settle=True)
    assert kind is torch.Tensor and grad is not None


def test_without_it_the_first_block_reads_a_collective_still_in_flight(tp_mesh) -> None:
    kind, grad = _first_block_input_and_embedding_grad(tp_mesh, settle=False)
    assert issubclass(kind, AsyncCollectiveTensor) and grad is not None
