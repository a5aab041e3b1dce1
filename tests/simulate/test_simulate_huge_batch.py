"""A huge simulated batch costs no host memory: the token batch is born on meta (``workload.MetaBatchTrainer``),
so ``flashckpt simulate --batch 1000000`` answers "does not fit" with the real per-device need (exit 1) instead of
first drawing tens of GB of tokens on the host; a workload no tensor can describe (past 2**63 bytes) is bad input
(exit 2) naming the tensor and the fix. Controls: the plain trainer draws its tokens on the host, and torch itself
cannot make the refused tensor."""

from __future__ import annotations

import time

import pytest
import torch

from pytest_flashckpt import training
from pytest_flashckpt.cli import main
from pytest_flashckpt.config.model_card import load_card
from pytest_flashckpt.simulate import simulate_step, workload
from pytest_flashckpt.simulate.workload import MetaBatchTrainer, largest_tensor


def _host_token_draws(monkeypatch) -> list[tuple[int, ...]]:
    """Shapes of the token tensors ``training.make_batch`` draws on the host (torch.randint spied)."""
    drawn: list[tuple[int, ...]] = []
    real = torch.randint

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        drawn.append(tuple(out.shape))
        return out

    monkeypatch.setattr(training.torch, "randint", spy)
    return drawn


def test_the_simulated_batch_draws_no_tokens_on_the_host(monkeypatch):
    drawn = _host_token_draws(monkeypatch)
    model = torch.nn.Linear(2, 2, device="meta")
    model.config = load_card("tiny")
    plain = training.Trainer.create(model, 3, 16)
    plain.batch()
    assert drawn == [(3, 17)]  # control: the trainer the runner uses draws (batch, seq + 1) tokens on the host
    drawn.clear()
    x, y = MetaBatchTrainer.create(model, 3, 16).batch()
    assert drawn == [] and x.device.type == y.device.type == "meta"
    assert x.shape == y.shape == (3, 16) and x.dtype == y.dtype == torch.int64


@pytest.mark.slow
def test_meta_tokens_leave_the_simulated_peak_unchanged(monkeypatch):
    """The meta batch is the tensors the host batch's move to meta made: every number of the step is the same."""
    def summary(peak):
        return (peak.peak_bytes, peak.start_bytes, peak.end_bytes, dict(peak.breakdown), peak.peak_op,
                peak.block_kept_bytes, peak.outside_kept_bytes)

    for target, kernel in (("cuda", "flash"), ("cpu", "sdpa")):
        meta = summary(simulate_step("tiny", "bf16", 2, 64, kernel, "full", target=target))
        with monkeypatch.context() as patched:
            patched.setattr(workload, "MetaBatchTrainer", training.Trainer)  # the host-drawn batch, as before
            host = summary(simulate_step("tiny", "bf16", 2, 64, kernel, "full", target=target))
        assert meta == host


def test_a_million_sequences_is_a_fast_does_not_fit_with_the_real_need(capsys, monkeypatch):
    drawn = _host_token_draws(monkeypatch)
    started = time.perf_counter()
    code = main(["simulate", "--model", "tiny", "--seq", "512", "--batch", "1000000", "--device-memory", "80GiB"])
    elapsed = time.perf_counter() - started
    out = capsys.readouterr().out
    assert code == 1 and "does not fit (short by" in out
    assert "batch 1000000 x seq 512" in out and "predicted peak:" in out
    peak = int(out.split("predicted peak: ")[1].split("(")[1].split(" bytes")[0])
    assert peak > 1000000 * 512 * load_card("tiny").vocab_size * 2  # at least the bf16 logits: the real need
    assert drawn == [] and elapsed < 30


def test_a_batch_no_tensor_can_hold_is_bad_input_naming_the_tensor(capsys):
    batch = 10**15
    name, nbytes = largest_tensor(load_card("tiny"), batch, 512)
    assert name == "logits" and nbytes >= 2**63
    with pytest.raises(RuntimeError, match="overflow"):  # control: torch cannot describe it, not even on meta
        torch.empty((batch, 512, load_card("tiny").vocab_size), dtype=torch.float32, device="meta")
    assert main(["simulate", "--model", "tiny", "--seq", "512", "--batch", str(batch)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"batch {batch} x seq 512: the step's logits alone would be" in err
    assert "2**63 bytes" in err and "use a smaller batch or sequence" in err
