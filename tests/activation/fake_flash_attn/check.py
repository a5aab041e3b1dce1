"""Run in a fresh interpreter (custom ops are process-wide): ``python check.py v27|v25 CASE [CASE ...]``, a CASE
being ``fixed`` (selective_op as it is) or ``save-random-ops`` (the behaviour before the fix: random ops in the list
are saved), run in the order given. Trains one step of a dropout GPT on the fake flash-attn package without
checkpointing, then one under selective_op per case, and prints what the tests assert on, by case, as JSON.

The cases of one version share the interpreter: the fake package registers its op once, at import, and a case
changes nothing else that outlives its step (``save-random-ops`` replaces ``ops.consumes_rng``, which the policy
looks up at every call, so it goes last)."""

import json
import sys
from pathlib import Path

here = Path(__file__).parent
version, cases = sys.argv[1], sys.argv[2:]
sys.path[:0] = [str(here / version), str(here)]

import torch  # noqa: E402

from pytest_flashckpt.activation import apply_ac, ops  # noqa: E402
from pytest_flashckpt.config.scenario import ActivationConfig  # noqa: E402
from pytest_flashckpt.models import GPTConfig, build_model  # noqa: E402
from pytest_flashckpt.models.attention import OpNameRecorder, detect_kernel  # noqa: E402
from pytest_flashckpt.training import make_batch  # noqa: E402

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


def save_random_ops() -> None:
    ops.consumes_rng = lambda func, args, kwargs: False


CASES = ("fixed", "save-random-ops")  # the order they may run in: the second's patch is never undone
assert cases and all(case in CASES for case in cases) and cases == sorted(cases, key=CASES.index), cases
ref_loss, ref_grads, _, names = step("none")
results = {}
for case in cases:
    if case == "save-random-ops":
        save_random_ops()
    loss, grads, applied, _ = step("selective_op")
    results[case] = {
        "kernel": detect_kernel(names, "flash_attn"),
        "listed_before_import": listed_before_import,
        "save_ops": list(applied.save_ops),
        "matched": applied.matched_ops,
        "loss_equal": bool(torch.equal(loss, ref_loss)),
        "grads_equal": all(torch.equal(grads[n], ref_grads[n]) for n in ref_grads),
    }
print(json.dumps(results))
