"""Context parallel through torch's ring attention (``distributed.context_parallel``): the sequence shards and
positions a cp rank holds, the models' positions, the 3D mesh FSDP2 shards over, and the two places the fake
rank and the rank probe had to be made to count what a real rank holds. In one process, with torch's fake process
group; the gloo ranks themselves are ``test_cp_ranks.py`` (slow)."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import AsyncCollectiveTensor, all_gather_single
from torch.testing._internal.distributed.fake_pg import FakeStore

from pytest_flashckpt.config.layout import Layout
from pytest_flashckpt.distributed import context_parallel, tensor_parallel
from pytest_flashckpt.distributed.memory import ShardedLiveTensorProbe, _RankStorages
from pytest_flashckpt.models.cards import build_model, load_card


@contextlib.contextmanager
def fake_group(rank: int, world_size: int):
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("rank", "load_balanced", "expected"), [
    (0, True, [0, 1, 6, 7]), (1, True, [2, 3, 4, 5]), (1, False, [4, 5, 6, 7])])
def test_a_cp_rank_holds_torchs_head_tail_shard_with_its_positions(rank, load_balanced, expected) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    with fake_group(rank, 2):
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
        tokens = torch.arange(100, 108).repeat(3, 1)  # (B 3, seq 8): token i at place i
        (local,) = context_parallel.shard_sequence(mesh, [tokens], load_balanced)
        positions = context_parallel.local_positions(mesh, 8, "cpu", load_balanced)
    assert positions.tolist() == expected
    assert local.tolist() == [[100 + p for p in expected]] * 3


@pytest.mark.parametrize("card", ["llama-tiny", "tiny"])
def test_the_models_take_the_positions_of_their_tokens(card) -> None:
    model = build_model(load_card(card, n_layer=1, block_size=16), "sdpa", "cpu", torch.float32, seed=0)
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    plain = model(tokens)
    assert torch.equal(model(tokens, positions=torch.arange(8)), plain)  # the default places, bit for bit
    assert not torch.allclose(model(tokens, positions=torch.arange(8, 16)), plain)  # other places: other logits


def test_the_cp_mesh_flattens_dp_shard_and_cp_for_fsdp() -> None:
    with fake_group(3, 8):
        mesh = tensor_parallel.make_mesh(Layout(dp_shard=2, cp=2, tp=2))
        assert mesh.mesh_dim_names == ("dp_shard", "cp", "tp")
        assert tensor_parallel.fsdp_mesh(mesh).size() == 4 and mesh["cp"].size() == 2 and mesh["tp"].size() == 2
        plain = tensor_parallel.make_mesh(Layout(dp_shard=4, tp=2))
        assert tensor_parallel.fsdp_mesh(plain).mesh_dim_names == ("dp_shard",)


def test_the_rank_probe_counts_a_collectives_wrapper_as_the_result_it_holds() -> None:
    mode = _RankStorages("cpu")
    result = torch.empty(1000)
    mode.add(AsyncCollectiveTensor(result))
    mode.add(result)
    assert mode.live_bytes == 4000  # the wrapper's own storage reports 4000 B and holds none


def test_a_fake_ranks_gather_holds_one_result_as_a_real_rank_does() -> None:
    """torch's fake kernels of ``_wrap_tensor_autograd`` and ``wait_tensor`` return ``empty_like`` copies; the fake
    rank wraps and waits as a real rank does, so an all-gather costs its input and one result."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from pytest_flashckpt.simulate.fake_ranks import _eager_collectives

    from torch.distributed import _functional_collectives as funcol

    @contextlib.contextmanager
    def eager_with_torchs_fake_kernels():  # what the fake rank did before: eager wrapping, torch's fake kernels
        saved = funcol._are_we_tracing
        funcol._are_we_tracing = lambda: False
        try:
            yield
        finally:
            funcol._are_we_tracing = saved

    def peak(as_a_real_rank: bool) -> int:
        with fake_group(0, 4), FakeTensorMode(allow_non_fake_inputs=True):
            local = torch.empty(256)  # 1 KiB; the gathered result is 4 KiB
            context = _eager_collectives() if as_a_real_rank else eager_with_torchs_fake_kernels()
            with context, ShardedLiveTensorProbe("cpu").track(resident=[local]) as reading:
                gathered = all_gather_single(local, 0, dist.group.WORLD)
                if isinstance(gathered, AsyncCollectiveTensor):
                    gathered = gathered.wait()
                del gathered
        return reading.peak_bytes

    assert peak(as_a_real_rank=True) == 1024 + 4096
    assert peak(as_a_real_rank=False) == 1024 + 2 * 4096  # the control: torch's fake kernels copy the result


def test_a_compiled_block_of_the_fake_rank_keeps_the_wait_a_real_rank_compiles() -> None:
    """Traced by Dynamo, the fake rank's wait is torch's: the graph a real rank compiles has a ``wait_tensor``
    after each collective, and Inductor schedules the collectives around it (without it the ring's all-gather of a
    recomputed backward moved earlier, reports/spike-compiled-cp-stages.md). Eager, the wait still returns the
    result itself (the test above)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from pytest_flashckpt.simulate.fake_ranks import _eager_collectives

    graphs: list[torch.fx.GraphModule] = []

    def capture(gm, _inputs):
        graphs.append(gm)
        return gm.forward

    def gather(local):
        return all_gather_single(local, 0, dist.group.WORLD) * 2

    torch._dynamo.reset()
    try:
        with fake_group(0, 2), FakeTensorMode(allow_non_fake_inputs=True), _eager_collectives():
            torch.compile(gather, backend=capture, fullgraph=True)(torch.empty(8))
    finally:
        torch._dynamo.reset()
    targets = [str(node.target) for node in graphs[0].graph.nodes if node.op == "call_function"]
    assert any("wait_tensor" in t for t in targets), targets


def test_the_compiled_fake_ranks_wait_hands_back_its_input_as_a_real_ranks_does() -> None:
    """A compiled region calls ``wait_tensor`` on a collective's result and drops what it returns: torch's fake
    kernel returns a new buffer of the result's size, a real rank the result itself; the fake rank's probe hands
    the input back, so the wait costs nothing."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from pytest_flashckpt.distributed.memory import CompiledShardedProbe
    from pytest_flashckpt.simulate.rank_probe import CompiledRankProbe

    def peak(probe_class) -> tuple[int, bool]:
        with FakeTensorMode():
            result = torch.empty(256)  # 1 KiB
            with probe_class("cpu").track(resident=[result]) as reading:
                waited = torch.ops._c10d_functional.wait_tensor.default(result)
                same = waited is result
                del waited
        return reading.peak_bytes, same

    assert peak(CompiledRankProbe) == (1024, True)
    assert peak(CompiledShardedProbe) == (2048, False)  # the control: torch's fake kernel, a second buffer


def test_a_real_tensors_wait_runs_under_the_compiled_fake_ranks_probe() -> None:
    """The same probe measures gloo ranks (benchmarks/spike_compiled_fake_ranks.py): a real collective's wait must
    run there (skipped, a rank read an all-gather's result before it was complete and crashed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from pytest_flashckpt.simulate.rank_probe import _CompiledRankStorages

    wait = torch.ops._c10d_functional.wait_tensor.default
    real = _CompiledRankStorages("cpu")
    with real:
        wait(torch.empty(4))
    assert real._op is wait  # dispatched to torch's op
    fake = _CompiledRankStorages("cpu")
    with FakeTensorMode():
        result = torch.empty(4)
        with fake:
            assert wait(result) is result
    assert fake._op is None  # handed back, never dispatched
