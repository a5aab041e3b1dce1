"""The public checkpoint API around a loop of one's own: every save strategy resumes bitwise, with an optional
scheduler and extra ``Stateful`` state (a loader position, a counter), on a model the project does not ship."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from pytest_flashckpt.checkpoint import CheckpointError, CheckpointManager, SelectiveResumeWarning, resume, save
from pytest_flashckpt.models.anatomy import BlockAnatomy, ModelAnatomy

STRATEGIES: dict[str, dict] = {
    "sync": {"strategy": "sync"},
    "sync-safetensors": {"strategy": "sync", "format": "safetensors"},
    "async": {"strategy": "async"},
    "async-overlapped": {"strategy": "async", "staging": "overlapped"},
    "dcp": {"strategy": "dcp"},
    "dcp-async": {"strategy": "dcp", "async_save": True},
    "selective": {"strategy": "selective", "select_params": "trainable"},
    "layerwise": {"strategy": "layerwise"},
    "scheduled": {"strategy": "scheduled", "mem_threshold": 1.0},
}


class Net(nn.Module):
    """Not one of the project's models: an embedding, a list of residual MLP blocks, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.layers = nn.ModuleList(nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16), nn.GELU()) for _ in range(2))
        self.head = nn.Linear(16, 20)

    def anatomy(self) -> ModelAnatomy:
        """Where the blocks are (a layer-wise save writes one file per block) and which module embeds."""
        return ModelAnatomy("custom", "layers", BlockAnatomy({"up": "1"}, attention="1", norms=("0",)), ("embed",), "head")

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = h + layer(h)
        return self.head(nn.functional.dropout(h, 0.1))


class Cursor:
    def __init__(self) -> None:
        self.position, self.seen = 0, torch.zeros(3)

    def state_dict(self) -> dict:
        return {"position": self.position, "seen": self.seen.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.position, self.seen = state["position"], state["seen"].clone()


def make(seed: int = 0, scheduler: bool = True, frozen: bool = False):
    torch.manual_seed(seed)
    model = Net()
    if frozen:
        model.embed.weight.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5) if scheduler else None
    return model, opt, sched, Cursor()


def train(model, opt, sched, cursor, steps: int) -> None:
    for _ in range(steps):
        gen = torch.Generator().manual_seed(cursor.position)
        tokens = torch.randint(0, 20, (4, 9), generator=gen)
        loss = nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        opt.zero_grad(set_to_none=True)
        cursor.position += 1
        cursor.seen += loss.detach()


def assert_bitwise(a: tuple, b: tuple) -> None:
    for (name, x), (_, y) in zip(a[0].state_dict().items(), b[0].state_dict().items()):
        assert torch.equal(x, y), name
    sa, sb = a[1].state_dict()["state"], b[1].state_dict()["state"]
    assert sa.keys() == sb.keys()
    for i in sa:
        for key in sa[i]:
            assert torch.equal(sa[i][key], sb[i][key]), (i, key)
    if a[2] is not None:
        assert a[2].state_dict() == b[2].state_dict()
    assert a[3].position == b[3].position and torch.equal(a[3].seen, b[3].seen)


@pytest.mark.slow
@pytest.mark.parametrize("with_scheduler", [True, False], ids=["scheduler", "no-scheduler"])
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_own_loop_resumes_bitwise(name: str, with_scheduler: bool, tmp_path: Path) -> None:
    frozen = name == "selective"  # trainable selection: the frozen embedding comes from the base, exactly
    straight = make(scheduler=with_scheduler, frozen=frozen)
    torch.manual_seed(7)
    train(*straight, 5)

    first = make(scheduler=with_scheduler, frozen=frozen)
    torch.manual_seed(7)
    model, opt, sched, cursor = first
    with CheckpointManager(tmp_path, model=model, optimizer=opt, scheduler=sched, extra={"cursor": cursor}, **STRATEGIES[name]) as ckpt:
        assert ckpt.resume() is None
        for step in range(3):
            train(*first, 1)
            ckpt.maybe_save(step + 1)
    torch.manual_seed(99)  # the resume must restore the RNG streams too (dropout)
    again = make(seed=1, scheduler=with_scheduler, frozen=frozen)
    step = resume(tmp_path, model=again[0], optimizer=again[1], scheduler=again[2], extra={"cursor": again[3]}, required=True)
    assert step == 3 and again[3].position == 3
    train(*again, 2)
    assert_bitwise(again, straight)


def test_layerwise_writes_a_file_per_block_of_the_anatomy(tmp_path: Path) -> None:
    model, opt, sched, cursor = make()
    train(model, opt, sched, cursor, 1)
    record = save(tmp_path, model=model, optimizer=opt, step=1, strategy="layerwise")
    files = sorted(p.name for p in (tmp_path / record.name / "layers").iterdir())
    assert files == ["block_000.pt", "block_001.pt", "rest.pt"]


def test_layerwise_without_an_anatomy_says_how_to_give_one(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="one file per block, but its blocks are unknown: no anatomy for a Sequential.*anatomy\\(\\)"):
        save(tmp_path, model=model, optimizer=opt, step=0, strategy="layerwise")
    assert not any(tmp_path.iterdir()) or not (tmp_path / "latest").exists()


def test_one_call_save_and_resume(tmp_path: Path) -> None:
    model, opt, sched, cursor = make()
    train(model, opt, sched, cursor, 2)
    record = save(tmp_path, model=model, optimizer=opt, scheduler=sched, extra={"cursor": cursor}, step=2, strategy="async")
    assert record.done and (tmp_path / record.name).is_dir()
    fresh = make(seed=3)
    assert resume(tmp_path, model=fresh[0], optimizer=fresh[1], scheduler=fresh[2], extra={"cursor": fresh[3]}) == 2
    assert torch.equal(fresh[0].head.weight, model.head.weight) and fresh[3].position == 2


def test_bad_extra_is_named_before_anything_runs(tmp_path: Path) -> None:
    model, opt, _, _ = make()
    with pytest.raises(ValueError, match=r"extra\['counter'\].*state_dict\(\) / load_state_dict\(\)"):
        CheckpointManager(tmp_path, model=model, optimizer=opt, extra={"counter": 3})
    with pytest.raises(TypeError, match="unknown save option.*max_kept"):
        CheckpointManager(tmp_path, model=model, optimizer=opt, max_kept=2)


def test_resume_with_other_extras_or_scheduler_is_an_error(tmp_path: Path) -> None:
    model, opt, sched, cursor = make()
    save(tmp_path, model=model, optimizer=opt, scheduler=sched, extra={"cursor": cursor}, step=0)
    fresh = make()
    with pytest.raises(CheckpointError, match=r"extra state \['cursor'\] but \[\] was given"):
        resume(tmp_path, model=fresh[0], optimizer=fresh[1], scheduler=fresh[2])
    with pytest.raises(CheckpointError, match="holds a scheduler's state but none was given"):
        resume(tmp_path, model=fresh[0], optimizer=fresh[1], extra={"cursor": fresh[3]})


def test_selective_resume_of_a_trained_parameter_left_to_the_base_warns(tmp_path: Path) -> None:
    model, opt, sched, cursor = make()  # nothing frozen: select only the blocks, the trained head is left out
    with CheckpointManager(tmp_path, model=model, optimizer=opt, strategy="selective", select_params=["layers.*"]) as ckpt:
        train(model, opt, sched, cursor, 1)
        ckpt.save(1)
        train(model, opt, sched, cursor, 1)
        ckpt.save(2)
    fresh = make(seed=2)
    with pytest.warns(SelectiveResumeWarning, match=r"trainable parameter\(s\) came from .*base.*head\.bias"):
        assert resume(tmp_path, model=fresh[0], optimizer=fresh[1]) == 2


def test_example_own_loop_resumes_bitwise(tmp_path: Path, monkeypatch, capsys) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "own_loop.py"

    def run(*argv: str) -> str:
        monkeypatch.setattr(sys, "argv", [str(example), *argv])
        runpy.run_path(str(example), run_name="__main__")
        return capsys.readouterr().out

    straight = run(str(tmp_path / "a"), "--steps", "5")
    stopped = run(str(tmp_path / "b"), "--steps", "5", "--stop-after", "3")
    assert "weights" not in stopped and "step 3 " in stopped
    resumed = run(str(tmp_path / "b"), "--steps", "5", "--strategy", "async")
    assert "step 1 " not in resumed and "step 4 " in resumed
    digest = [line for line in straight.splitlines() if line.startswith("weights")]
    assert digest and digest == [line for line in resumed.splitlines() if line.startswith("weights")]
