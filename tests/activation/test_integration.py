"""What the runner uses: the suite file, AppliedActivation.describe, count_step_flops(trainer)."""

from __future__ import annotations

import torch

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.activation.flops import count_step_flops, measure_step_flops
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.config.suites import load_suite
from pytest_flashckpt.models import GPTConfig, build_model
from pytest_flashckpt.training import Trainer

SMALL = GPTConfig(vocab_size=64, block_size=64, n_layer=4, n_head=2, n_embd=32)


def test_activation_suite_loads_with_every_strategy_backend_and_length():
    suite = load_suite("activation")
    combos = {(s.activation.strategy, s.attention, s.seq_len) for s in suite.scenarios}
    strategies = ("none", "full", "every_k", "selective_op", "offload")
    assert combos == {(st, "sdpa", t) for st in strategies for t in (256, 512)}  # eager sweeps: the `full` suite
    assert all(s.measure == ("memory", "timing", "flops") for s in suite.scenarios)
    assert {s.card for s in suite.scenarios} == {"tiny", "llama-tiny"}  # both families (issue 20)
    llama = {(s.activation.strategy, s.seq_len) for s in suite.scenarios if s.card == "llama-tiny"}
    assert llama == {("none", 256), ("full", 256), ("selective_op", 256)}
    article = [s for s in suite.scenarios if s.article]
    assert [(s.name, s.article, s.activation.strategy) for s in article] == [
        ("full-sdpa-s256", "gradient_checkpointing", "full"), ("full-sdpa-s512", "gradient_checkpointing", "full"),
    ]


def test_describe():
    model = build_model(SMALL, "sdpa")
    assert apply_ac(model, ActivationConfig(strategy="full")).describe() == "full on blocks 0-3"
    model = build_model(SMALL, "sdpa")
    assert apply_ac(model, ActivationConfig(strategy="every_k", k=2)).describe() == "every_k on blocks 0, 2"
    model = build_model(SMALL, "sdpa")
    applied = apply_ac(model, ActivationConfig(strategy="selective_op", save_ops=("aten.addmm.default",)))
    Trainer.create(model, 2, 16).train_step()
    assert applied.describe() == "selective_op on blocks 0-3 (saving 1 ops; matched aten.addmm.default x16)"


def test_count_step_flops_leaves_the_trainer_as_it_was():
    model = build_model(SMALL, "sdpa")
    apply_ac(model, ActivationConfig(strategy="selective_op"))
    trainer = Trainer.create(model, 2, 16)
    trainer.train_step()
    flops = count_step_flops(trainer)
    fresh = build_model(SMALL, "sdpa")
    apply_ac(fresh, ActivationConfig(strategy="selective_op"))
    assert flops == measure_step_flops(fresh, 2, 16).matmul_flops > 0
    assert all(p.grad is None for p in model.parameters())
    assert trainer.step == 1
    assert torch.isfinite(trainer.train_step())
