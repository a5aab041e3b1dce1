"""Run in a fresh interpreter (custom ops are process-wide): ``python check.py v27|v25 [--save-random-ops]``.
Trains one step of a dropout GPT on the fake flash-attn package and prints what the tests assert on, as JSON."""

import json
import sys
from pathlib import Path

here = Path(__file__).parent
version = sys.argv[1]
sys.path[:0] = [str(here / version), str(here)]

import torch  # noqa: E402

from pytest_flashckpt.activation import apply_ac, ops  # noqa: E402
from pytest_flashckpt.config.scenario import ActivationConfig  # noqa: E402
from pytest_flashckpt.models import GPTConfig, build_model  # noqa: E402
from pytest_flashckpt.models.attention import OpNameRecorder, detect_kernel  # noqa: E402
from pytest_flashckpt.training import make_batch  # noqa: E402

if "--save-random-ops" in sys.argv:  # the behaviour before the fix: random ops in the list are saved
    ops.consumes_rng = lambda func, args, kwargs: False

CONFIG = GPTConfig(vocab_size=64, block_size=64, n_layer=2, n_head=2, n_embd=32, dropout=0.1)
listed_before_import = "flashattn._flash_attn_forward.default" in ops.default_save_ops()


def step(strategy):
    model = build_model(CONFIG, "flash_attn", "cpu", torch.float32, seed=3)
    applied = apply_ac(model, ActivationConfig(strategy=strategy))
    x, y = make_batch(CONFIG.vocab_size, 2, 32, seed=1, position=0)
    torch.manual_seed(0)
    with OpNameRecorder() as recorder:
        loss = model(x, y)
        loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, applied, recorder.op_names


ref_loss, ref_grads, _, names = step("none")
loss, grads, applied, _ = step("selective_op")
print(json.dumps({
    "kernel": detect_kernel(names, "flash_attn"),
    "listed_before_import": listed_before_import,
    "save_ops": list(applied.save_ops),
    "matched": applied.matched_ops,
    "loss_equal": bool(torch.equal(loss, ref_loss)),
    "grads_equal": all(torch.equal(grads[n], ref_grads[n]) for n in ref_grads),
}))
