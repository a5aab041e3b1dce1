"""The step as users configure it (config.step_impl): each norm, optimizer and loss measured on a CPU equals its
simulation on meta to the byte, each setting changes what it should (a control per setting), the defaults are
the step that ran before, and bad settings are refused naming the key."""

from dataclasses import replace
from functools import lru_cache

import pytest
import torch

from pytest_flashckpt.cli import main
from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.cards.llama import LlamaConfig
from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.config.step_impl import STATE_TENSORS_PER_PARAMETER, StepImpl, card_with_norm
from pytest_flashckpt.config.typed import build
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.probes.cpu import LiveTensorProbe
from pytest_flashckpt.simulate import simulate_step
from pytest_flashckpt.training import Trainer

# activations (and the logits over a vocabulary 16x the width) outweigh the optimizer step: the norm and the loss
# move the peak, not only the optimizer phase
WIDE_VOCAB = LlamaConfig(name="step-impl-tiny", vocab_size=2048, block_size=256, n_layer=2, n_head=4, n_kv_head=2,
                         n_embd=64, intermediate_size=160)
# parameters outweigh activations (a short sequence): the optimizer step peaks
WIDE_MODEL = LlamaConfig(name="step-impl-wide", vocab_size=512, block_size=64, n_layer=2, n_head=4, n_kv_head=2,
                         n_embd=128, intermediate_size=352)
BATCH, SEQ = 2, 64
SHAPES = {WIDE_VOCAB.name: (BATCH, SEQ), WIDE_MODEL.name: (1, 16)}


@lru_cache(maxsize=None)
def measured(card, impl: StepImpl) -> tuple[int, int, float]:
    """Peak and start bytes of the second real CPU step (fp32, SDPA), and its loss (once per card and setting)."""
    model = build_model(card_with_norm(card, impl.norm), "sdpa", "cpu", torch.float32)
    trainer = Trainer.create(model, *SHAPES[card.name], impl=impl)
    trainer.train_step()
    with LiveTensorProbe().track(trainer.state_tensors()) as reading:
        loss = trainer.train_step()
    return reading.peak_bytes, reading.start_bytes, float(loss)


def simulated(card, impl: StepImpl):
    return simulate_step(card, "float32", *SHAPES[card.name], "sdpa", "none", target="cpu", impl=impl)


# the default step on these cards is slow-marked: tests/simulate/test_simulate_llama.py checks it by default
CASES = [pytest.param(WIDE_VOCAB, StepImpl(), marks=pytest.mark.slow), (WIDE_VOCAB, StepImpl(norm="fused")),
         (WIDE_VOCAB, StepImpl(loss="chunked", loss_chunks=3)), pytest.param(WIDE_MODEL, StepImpl(), marks=pytest.mark.slow),
         *((WIDE_MODEL, StepImpl(optimizer=name)) for name in ("adamw_foreach", "adamw_fused", "sgd"))]


@pytest.mark.slow
@pytest.mark.parametrize(("card", "impl"), CASES, ids=lambda x: getattr(x, "name", None) or x.describe())
def test_measured_equals_simulated_on_cpu(card, impl):
    peak, start, _ = measured(card, impl)
    sim = simulated(card, impl)
    assert (sim.peak_bytes, sim.start_bytes) == (peak, start)


@pytest.mark.slow
def test_each_setting_changes_what_it_should():
    """Controls: the settings are not ignored. Where the optimizer step peaks, foreach AdamW adds full-size
    temporaries the per-tensor CPU step does not and fused AdamW is lower still; AdamW keeps two state tensors of
    each parameter's size, SGD one; the chunked loss never holds every token's logits (and their gradient)."""
    default, foreach, fused, sgd = (simulated(WIDE_MODEL, StepImpl(optimizer=name))
                                    for name in ("adamw", "adamw_foreach", "adamw_fused", "sgd"))
    assert default.peak_phase == foreach.peak_phase == "optimizer"
    assert fused.peak_bytes < default.peak_bytes < foreach.peak_bytes
    params = WIDE_MODEL.num_params() * 4
    steps = 4 * len(list(build_model(WIDE_MODEL, "sdpa", "meta").parameters()))  # AdamW's float32 step scalars
    assert default.breakdown["optimizer_state"] == STATE_TENSORS_PER_PARAMETER["adamw"] * params + steps
    assert sgd.breakdown["optimizer_state"] == STATE_TENSORS_PER_PARAMETER["sgd"] * params
    plain, chunked = simulated(WIDE_VOCAB, StepImpl()), simulated(WIDE_VOCAB, StepImpl(loss="chunked", loss_chunks=3))
    logits = BATCH * SEQ * WIDE_VOCAB.vocab_size * 4
    assert plain.peak_bytes - chunked.peak_bytes >= logits


def test_chunked_loss_equals_the_plain_loss():
    _, _, plain = measured(WIDE_VOCAB, StepImpl())
    _, _, chunked = measured(WIDE_VOCAB, StepImpl(loss="chunked", loss_chunks=3))  # uneven chunks: 22, 22, 20 tokens
    assert chunked == pytest.approx(plain, rel=1e-5)


def test_fused_norm_on_cuda_keeps_the_input_not_a_float32_copy():
    """On a cuda target the fused norm is CUDA's _fused_rms_norm (simulate.step_impl): per norm it keeps the
    2-byte input and a float32 rstd, where the plain norm keeps a float32 copy of the input and the normalised
    value before the weight (4 + 2 bytes a value) and the same rstd; the output is kept by the next matmul either
    way. So 4 bytes a value less per norm, two norms a block."""
    card = replace(WIDE_VOCAB, norm="plain")
    plain = simulate_step(card, "bf16", BATCH, SEQ, "flash", "none")
    fused = simulate_step(replace(card, norm="fused"), "bf16", BATCH, SEQ, "flash", "none")
    per_block = {p - f for p, f in zip(plain.block_kept_bytes, fused.block_kept_bytes)}
    assert per_block == {2 * (4 + 2 - 2) * card.n_embd * BATCH * SEQ}
    assert fused.peak_bytes < plain.peak_bytes


def test_the_fused_norm_saves_what_cudas_autograd_node_saves():
    """FusedRmsNormOnMeta keeps the tensors torch's CUDA node FusedRmsNormBackward0 names (input, weight, result1 =
    rstd), with CUDA's dtypes: the input's and float32 statistics, one per row."""
    from pytest_flashckpt.simulate.step_impl import FusedRmsNormOnMeta

    node_fields = {name.removeprefix("_saved_") for name in dir(torch._C._functions.FusedRmsNormBackward0)
                   if name.startswith("_saved_") and name != "_saved_normalized_shape"}
    assert node_fields == {"input", "weight", "result1"}
    x = torch.empty(2, 5, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.empty(64, device="meta", dtype=torch.bfloat16, requires_grad=True)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = FusedRmsNormOnMeta.apply(x, weight, [64], 1e-5)[0]
    assert [(tuple(t.shape), t.dtype) for t in saved] == [((2, 5, 64), torch.bfloat16), ((64,), torch.bfloat16),
                                                         ((2, 5, 1), torch.float32)]
    y.sum().backward()
    assert (x.grad.shape, x.grad.dtype, weight.grad.shape) == (x.shape, torch.bfloat16, weight.shape)


def test_defaults_are_the_step_that_ran_before():
    """No setting: the card's plain norm, AdamW as PyTorch picks it (foreach None), the model's own loss."""
    card = load_card("llama-tiny")
    assert card.norm == "plain" and StepImpl() == Scenario("s").step_impl
    model = build_model(card, "sdpa", "meta")
    assert type(model.norm).__name__ == "RMSNorm" and not isinstance(model.norm, torch.nn.RMSNorm)
    trainer = Trainer.create(model, 1, 8)
    assert isinstance(trainer.optimizer, torch.optim.AdamW) and trainer.optimizer.defaults["foreach"] is None
    assert not trainer.optimizer.defaults["fused"] and trainer.impl == StepImpl()
    assert isinstance(build_model(replace(card, norm="fused"), "sdpa", "meta").norm, torch.nn.RMSNorm)


def test_scenario_reads_step_impl_and_keeps_it_in_its_reference():
    scenario = build(Scenario, {"name": "s", "model": "llama-tiny", "activation": {"strategy": "full"},
                                "step_impl": {"norm": "fused", "optimizer": "sgd", "loss": "chunked"}}, "suite.yaml")
    assert scenario.step_impl == StepImpl("fused", "sgd", "chunked") == scenario.reference().step_impl


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"step_impl": {"optimizer": "adam"}}, "step_impl.optimizer: .*'adam'.*valid: .*adamw_fused"),
        ({"step_impl": {"loss_chunks": 0}}, "step_impl.loss_chunks must be a positive number of chunks, got 0"),
        ({"step_impl": {"norm": "fast"}}, "step_impl.norm: .*'fast'.*valid: plain, fused"),
        ({"step_impl": {"loss": "chunked"}, "activation": {"strategy": "budget", "budget": 0.5}},
         "step_impl .* with activation.strategy budget is not supported"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(data, message):
    with pytest.raises(ConfigError, match=message) as caught:
        build(Scenario, {"name": "s", **data}, "suite.yaml")
    assert "suite.yaml" in str(caught.value)


def test_card_norm_is_validated_and_gpt_has_none_to_choose():
    with pytest.raises(ValueError, match="norm: unknown RMSNorm implementation 'fast'; valid: plain, fused"):
        LlamaConfig(norm="fast")
    with pytest.raises(ValueError, match="model card 'tiny' .*has no RMSNorm to choose"):
        card_with_norm(load_card("tiny"), "fused")


def test_simulate_cli_takes_the_settings(capsys):
    argv = ["simulate", "--model", "llama-tiny", "--seq", "64", "--batch", "1", "--kernel", "sdpa", "--target", "cpu",
            "--dtype", "fp32"]
    assert main([*argv, "--norm", "fused", "--optimizer", "adamw_fused", "--loss", "chunked"]) == 0
    assert "step: norm fused, optimizer adamw_fused, loss chunked x8" in capsys.readouterr().out
    assert main([*argv, "--loss", "chunked", "--loss-chunks", "0"]) == 2
    assert "--loss-chunks must be a positive number of chunks" in capsys.readouterr().err


@pytest.mark.parametrize("norm", ["plain", "fused"])
def test_llama_block_is_korthikantis_arithmetic_plus_exact_terms(norm):
    """The simulated bf16 block on CUDA's flash kernel equals Korthikanti's arithmetic on a Llama block plus the
    listed terms, to the byte, for each norm (the 8B numbers: reports/step-impl.md)."""
    from pytest_flashckpt.activation.analytic import korthikanti_llama_terms

    card = replace(WIDE_VOCAB, norm=norm)
    sim = simulate_step(card, "bf16", BATCH, SEQ, "flash", "none")
    assert set(sim.block_kept_bytes) == {sum(korthikanti_llama_terms(card, BATCH, SEQ, norm).values())}


def test_a_suite_scenario_runs_and_simulates_its_step_impl():
    """The runner's trainer and the simulated scenario both take the scenario's step_impl: measured == simulated,
    and both differ from the default step's (SGD's one state tensor a parameter moves the peak)."""
    from pytest_flashckpt.core.result import Result
    from pytest_flashckpt.runner.context import RunContext
    from pytest_flashckpt.runner.run import run_scenario
    from pytest_flashckpt.simulate.scenario import run_simulated

    impl = {"optimizer": "sgd", "loss": "chunked", "loss_chunks": 2}
    common = {"name": "s", "suite": "impl", "model": "llama-tiny", "attention": "sdpa", "batch_size": 1, "seq_len": 32,
              "measure": ["memory"], "rounds": 1, "step_impl": impl}
    measured_result = run_scenario(build(Scenario, common, "suite.yaml"), RunContext(device=torch.device("cpu"), probe="cpu"))
    assert measured_result.status == "measured", measured_result.reason
    simulated_scenario = build(Scenario, {**common, "simulate": {"enabled": True, "kernel": "sdpa", "target": "cpu"}}, "suite.yaml")
    simulated_result = Result("impl", "s", "measured", simulated_scenario)
    run_simulated(simulated_scenario, simulated_result)
    peak = measured_result.metrics["peak_bytes"]
    assert simulated_result.metrics["simulated_peak_bytes"] == peak
    assert simulate_step("llama-tiny", "float32", 1, 32, "sdpa", "none", target="cpu").peak_bytes != peak


@pytest.mark.parametrize(
    ("data", "message"),
    [({"model": "tiny", "step_impl": {"norm": "fused"}}, "model card 'tiny' .*has no RMSNorm to choose"),
     ({"model": "llama-tiny", "dtype": "bfloat16", "precision": "mixed", "simulate": {"enabled": True},
       "step_impl": {"norm": "fused"}}, "fused RMSNorm under mixed precision on CUDA is not simulated")],
)
def test_preflight_refuses_a_step_impl_the_card_or_simulator_cannot_take(data, message):
    from pytest_flashckpt.config.preflight import preflight

    with pytest.raises(ConfigError, match=message) as caught:
        preflight(build(Scenario, {"name": "s", **data}, "suite.yaml"), "suite.yaml")
    assert "scenario 's'" in str(caught.value) and "step_impl" in str(caught.value)
