"""Subprocess for test_fsdp: the real FSDP2 ``fully_shard`` layout of a model card on meta, rank 0 of N, with a
fake process group (nothing is communicated). Prints JSON: parameter name -> [full shape, local shard bytes]."""

import json
import sys


def main(card: str, world_size: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from pytest_flashckpt.models.cards import build_model, load_card

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        model = build_model(load_card(card), "eager", "meta", torch.bfloat16)
        shapes = {name: list(p.shape) for name, p in model.named_parameters()}
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        out = {}
        for name, p in model.named_parameters():
            local = p.to_local()
            out[name] = [shapes[name], local.untyped_storage().nbytes(), local.numel() * local.element_size()]
        print(json.dumps(out))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
