"""Subprocess for test_layer_extrapolation: each case's simulated rank (``simulate.fake_ranks.simulate_rank``) in the
case's ``ways``, one after the other in this one interpreter: ``extrapolated`` from shallower depths (the default),
``whole`` (simulated whole with the default rank probe, ``simulate.rank_probe``) and ``exact_probe`` (simulated whole
with the probe the gloo ranks use, ``distributed.memory``). Prints JSON on its last line: case name -> {way: record}.

    python extrapolation_cases.py '[{"name": ..., "card": "llama-tiny", "overrides": {...}, "dp": 2, "tp": 1,
                                     "strategy": "full", "precision": "pure", "batch": 4, "seq": 32,
                                     "ways": ["extrapolated", "whole"]}]'
"""

import json
import sys


def run(case: dict) -> dict:
    import torch

    from pytest_flashckpt.config.layout import Layout
    from pytest_flashckpt.distributed.memory import ShardedLiveTensorProbe
    from pytest_flashckpt.models.cards import load_card
    from pytest_flashckpt.simulate.fake_ranks import simulate_rank

    card = load_card(case["card"], **case.get("overrides", {}))
    dtype = torch.bfloat16 if case["precision"] == "mixed" else torch.float32
    common = dict(batch_size=case["batch"], seq_len=case["seq"], strategy=case["strategy"], k=case.get("k", 2),
                  dtype=dtype, precision=case["precision"], foreach=case.get("foreach"))
    layout = Layout(dp_shard=case["dp"], tp=case["tp"])
    ways = {
        "extrapolated": {},
        "whole": {"extrapolate": False},
        "exact_probe": {"extrapolate": False, "probe_class": ShardedLiveTensorProbe},
    }
    return {way: simulate_rank(card, layout, **common, **ways[way]) for way in case["ways"]}


def main(cases: list[dict]) -> None:
    print(json.dumps({case["name"]: run(case) for case in cases}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
