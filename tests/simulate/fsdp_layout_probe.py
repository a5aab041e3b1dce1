"""For test_simulate_fsdp (which calls ``layout`` in its own process; also runs as a script): the real FSDP2
``fully_shard`` layout of a model card on meta, rank 0 of N, with a fake process group (nothing is communicated),
for each N given, one after the other in this one interpreter (a fresh model and a fresh process group each:
nothing of one layout is left for the next). Prints JSON on one line: N -> parameter name -> [full shape, local
shard storage bytes, local shard bytes]."""

import json
import sys


def layout(card: str, world_size: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from pytest_flashckpt.models.cards import build_model, load_card

    assert not dist.is_initialized(), "the previous layout's process group is still there"
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        assert dist.get_world_size() == world_size
        model = build_model(load_card(card), "eager", "meta", torch.bfloat16)
        shapes = {name: list(p.shape) for name, p in model.named_parameters()}
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        out = {}
        for name, p in model.named_parameters():
            assert p.device_mesh.size() == world_size, (name, p.device_mesh)
            local = p.to_local()
            out[name] = [shapes[name], local.untyped_storage().nbytes(), local.numel() * local.element_size()]
        return out
    finally:
        dist.destroy_process_group()


def main(card: str, world_sizes: list[int]) -> None:
    print(json.dumps({n: layout(card, n) for n in world_sizes}))


if __name__ == "__main__":
    main(sys.argv[1], [int(n) for n in sys.argv[2:]])
