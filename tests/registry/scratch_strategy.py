"""A strategy added in a scratch registry, run in a fresh interpreter: registered before ``config`` is imported,
as a row of ``core/registry.py`` is. Prints one JSON line: what each consumer of the registry made of it.

``scratch_first_half`` recomputes the first half of the blocks (its plan is below); ``scratch_on_host`` is one the
meta simulation refuses (``not_simulated``), so its reason must reach ``flashckpt simulate``. Neither sets the
opt-in simulators' attributes (``runs_on_fake_ranks``, ``fit_order``, ``simulated_compiled``); ``scratch_odd_blocks``
(blocks 1, 3, 5, ... recomputed: a plan that repeats with depth) sets all three, so it must reach
``flashckpt simulate --tp 2``, fit's candidates and the compiled simulator's list, where the other two are refused
naming the attribute.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace

from pytest_flashckpt.core.registry import ActivationStrategySpec, register_activation_strategy

register_activation_strategy(ActivationStrategySpec(
    "scratch_first_half", "the first half of the blocks recomputed", "scratch_strategy:scratch_first_half_plan"))
register_activation_strategy(ActivationStrategySpec(
    "scratch_on_host", "kept on the host", "scratch_strategy:scratch_first_half_plan", not_simulated="the scratch reason it is refused"))
register_activation_strategy(ActivationStrategySpec(
    "scratch_odd_blocks", "blocks 1, 3, 5, ... recomputed", "scratch_strategy:scratch_odd_blocks_plan",
    runs_on_fake_ranks=True, fit_order=2, simulated_compiled="traced"))


def scratch_first_half_plan(config, n_blocks, context):
    from pytest_flashckpt.activation.options import FULL, NONE

    return [FULL if i < n_blocks // 2 else NONE for i in range(n_blocks)]


def scratch_odd_blocks_plan(config, n_blocks, context):
    from pytest_flashckpt.activation.options import FULL, NONE

    return [FULL if i % 2 else NONE for i in range(n_blocks)]


def _cli(argv: list[str]) -> dict:
    from pytest_flashckpt.cli import main as flashckpt

    printed, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
        try:
            status = flashckpt(argv)
        except SystemExit as exc:
            status = exc.code
    return {"status": status, "stdout": printed.getvalue(), "stderr": errors.getvalue()}


def opt_in_simulators() -> dict:
    """What the fake-rank engine (``flashckpt simulate --tp 2``), fit and the compiled simulator made of the three
    scratch strategies."""
    from pytest_flashckpt.fit.candidates import STRATEGIES as FIT_STRATEGIES
    from pytest_flashckpt.fit.candidates import enumerate_candidates
    from pytest_flashckpt.fit.time_model import replay_counts
    from pytest_flashckpt.models import load_card
    from pytest_flashckpt.simulate.compiled import STRATEGIES as COMPILED_STRATEGIES
    from pytest_flashckpt.simulate.compiled import unsupported_reason
    from pytest_flashckpt.simulate.layouts import LAYOUT_STRATEGIES

    out: dict = {"layout_strategies": list(LAYOUT_STRATEGIES), "fit_strategies": list(FIT_STRATEGIES),
                 "compiled_strategies": list(COMPILED_STRATEGIES)}
    for name in ("scratch_odd_blocks", "scratch_first_half"):
        out[f"tp2_{name}"] = _cli(["simulate", "--model", "llama-tiny", "--seq", "32", "--batch", "4", "--dtype", "bf16",
                                   "--world-size", "2", "--tp", "2", "--strategy", name])
        out[f"fit_{name}"] = _cli(["fit", "--model", "llama-tiny", "--seq", "256", "--global-batch-tokens", "4096",
                                   "--gpus", "4", "--strategies", name, "--device-memory", "1MiB"])
    card = load_card("llama-tiny")
    candidates = enumerate_candidates(card, 4, seq_len=256, global_batch_tokens=4096, gpus_per_node=8)
    out["fit_candidate_strategies"] = sorted({c.strategy for c in candidates})
    scratch = next(c for c in candidates if c.strategy == "scratch_odd_blocks")
    out["fit_replays_of_5_blocks"] = list(replay_counts(scratch, 5))  # its tp collectives follow its plan
    from pytest_flashckpt.config.scenario import Scenario
    from pytest_flashckpt.config.typed import build

    out["compiled_refusals"] = {
        name: unsupported_reason(build(Scenario, {"name": "s", "model": "tiny", "dtype": "float32", "batch_size": 2,
                                                  "seq_len": 16, "compile": {"scope": "block"},
                                                  "activation": {"strategy": name}}, "scratch.yaml"))
        for name in ("scratch_odd_blocks", "scratch_first_half")}
    return out


def main(folder: Path) -> dict:
    from pytest_flashckpt.activation import apply_ac
    from pytest_flashckpt.activation.expected_flops import expected_matmul_flops
    from pytest_flashckpt.activation.flops import measure_step_flops
    from pytest_flashckpt.cli import main as flashckpt
    from pytest_flashckpt.config.preflight import preflight
    from pytest_flashckpt.config.suites import load_suite
    from pytest_flashckpt.models import build_model, load_card
    from pytest_flashckpt.report.distributed import simulated_rank_peak

    out: dict = {}
    suite_file = folder / "scratch.yaml"
    suite_file.write_text("name: scratch\nscenarios:\n  - {name: half, model: tiny, seq_len: 16, "
                          "batch_size: 2, activation: {strategy: scratch_first_half}}\n")
    scenario = load_suite(str(suite_file)).scenarios[0]
    preflight(scenario)
    card = load_card("tiny", vocab_size=64, n_embd=32, n_head=2, block_size=32)
    model = build_model(card, "sdpa")
    out["suite_blocks"] = list(apply_ac(model, scenario.activation).blocks)
    out["measured_flops"] = measure_step_flops(model, 2, 16).matmul_flops
    out["closed_form_flops"] = expected_matmul_flops(card, 2, 16, "scratch_first_half")
    out["full_flops"] = expected_matmul_flops(card, 2, 16, "full")
    out["none_flops"] = expected_matmul_flops(card, 2, 16, "none")
    for name in ("scratch_first_half", "scratch_on_host"):
        printed, errors = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
            try:
                status = flashckpt(["simulate", "--model", "tiny", "--seq", "16", "--batch", "2", "--dtype", "fp32",
                                    "--target", "cpu", "--kernel", "sdpa", "--strategy", name])
            except SystemExit as exc:
                status = exc.code
        out[f"simulate_{name}"] = {"status": status, "stdout": printed.getvalue(), "stderr": errors.getvalue()}
    from pytest_flashckpt.config.scenario import Scenario
    from pytest_flashckpt.config.typed import build

    def scenario(strategy: str) -> Scenario:  # a result's config is its typed scenario (config.record_file)
        return build(Scenario, {"name": "s", "model": "tiny", "dtype": "float32", "batch_size": 2, "seq_len": 16,
                                "activation": {"strategy": strategy}}, "scratch.yaml")

    distributed = SimpleNamespace(device="cpu", backend="sdpa", config=scenario("scratch_first_half"))
    out["report_peak"] = simulated_rank_peak(distributed)
    distributed.config = scenario("scratch_on_host")
    out["report_refused"] = simulated_rank_peak(distributed)
    out.update(opt_in_simulators())
    return out


if __name__ == "__main__":
    sys.modules["scratch_strategy"] = sys.modules["__main__"]  # the plan's "module:function" names this file
    print(json.dumps(main(Path(sys.argv[1]))))
