"""Checkpoints opened with plain tools: `flashckpt export` / `inspect`, and the docs' snippet run as written."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ckpt_helpers import TINY, make_trainer
from pytest_flashckpt import __version__
from pytest_flashckpt.checkpoint import Checkpointer, CheckpointError
from pytest_flashckpt.checkpoint.export import export_weights
from pytest_flashckpt.cli import main
from pytest_flashckpt.config.scenario import SaveConfig
from pytest_flashckpt.models import build_model

DOCS = Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md"


def saved(root: Path, config: SaveConfig, steps: int = 1):
    trainer = make_trainer()
    with Checkpointer(root, config) as ckpt:
        for _ in range(steps):
            trainer.train_step()
        record = ckpt.save(trainer)
    return trainer, root / record.name


def _same_weights(model: torch.nn.Module, expected: torch.nn.Module) -> None:
    got, want = model.state_dict(), expected.state_dict()
    assert sorted(got) == sorted(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key
    assert model.lm_head.weight is model.wte.weight  # still tied after the load


@pytest.mark.parametrize("config", [SaveConfig(strategy="sync", format="torch"), SaveConfig(strategy="async", format="safetensors"), SaveConfig(strategy="dcp")], ids=["sync-torch", "async-safetensors", "dcp"])
def test_export_loads_strictly_into_a_fresh_model_with_safetensors_alone(config, tmp_path) -> None:
    trainer, folder = saved(tmp_path / "ckpt", config, steps=2)
    done = export_weights(tmp_path / "ckpt", tmp_path / "weights.safetensors")  # the root: its latest
    assert done.source == folder and done.tied == {"lm_head.weight": "wte.weight"}
    sd = load_file(str(tmp_path / "weights.safetensors"))
    assert "lm_head.weight" in sd and not any(k.startswith(("model/", "optimizer/")) for k in sd)  # the alias too
    fresh = build_model(TINY, "sdpa", seed=5)
    fresh.load_state_dict(sd, strict=True)
    _same_weights(fresh, trainer.model)
    with safe_open(str(tmp_path / "weights.safetensors"), framework="pt") as fh:
        meta = fh.metadata()
    assert meta["format"] == "pt" and meta["flashckpt.step"] == "2" and meta["flashckpt.version"] == __version__
    assert meta["flashckpt.strategy"] == config.strategy and json.loads(meta["flashckpt.tied"]) == {"lm_head.weight": "wte.weight"}


def test_export_to_pt_loads_with_weights_only(tmp_path) -> None:
    trainer, folder = saved(tmp_path, SaveConfig(strategy="sync", format="safetensors"))
    export_weights(folder, tmp_path / "w.pt")
    fresh = build_model(TINY, "sdpa", seed=5)
    fresh.load_state_dict(torch.load(tmp_path / "w.pt", weights_only=True), strict=True)
    _same_weights(fresh, trainer.model)


def test_strict_load_still_names_a_really_missing_key(tmp_path) -> None:
    _, folder = saved(tmp_path, SaveConfig(strategy="sync"))
    export_weights(folder, tmp_path / "w.safetensors")
    sd = load_file(str(tmp_path / "w.safetensors"))
    del sd["ln_f.weight"]
    with pytest.raises(RuntimeError, match="Missing key.*ln_f.weight"):
        build_model(TINY, "sdpa", seed=5).load_state_dict(sd, strict=True)


def test_checkpoint_safetensors_files_carry_format_metadata(tmp_path) -> None:
    _, folder = saved(tmp_path, SaveConfig(strategy="sync", format="safetensors"))
    with safe_open(str(folder / "state.safetensors"), framework="pt") as fh:
        assert fh.metadata() == {"format": "pt"}


def test_export_refuses_a_corrupt_checkpoint_and_an_unknown_suffix(tmp_path, capsys) -> None:
    _, folder = saved(tmp_path, SaveConfig(strategy="sync"))
    assert main(["export", str(folder), str(tmp_path / "w.bin")]) == 2
    assert "unknown export format '.bin'; name the file *.safetensors or *.pt" in capsys.readouterr().err
    data = bytearray((folder / "state.pt").read_bytes())
    data[300] ^= 0xFF
    (folder / "state.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256 does not match"):
        export_weights(folder, tmp_path / "w.safetensors")
    assert not (tmp_path / "w.safetensors").exists()


def test_inspect_prints_step_strategy_files_and_the_check(tmp_path, capsys) -> None:
    _, folder = saved(tmp_path, SaveConfig(strategy="async", format="safetensors"), steps=3)
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"latest -> {folder.name}" in out
    assert "step: 3  strategy: async  format: safetensors  base: -" in out
    assert re.search(r"state\.safetensors\s+[\d.,]+ KiB", out) and "meta.json" in out
    assert "check: verified (2 files: sizes and sha256 match the manifest)" in out
    (folder / "meta.json").write_text("{}")
    assert main(["inspect", str(folder)]) == 1
    assert "check: CORRUPT: " in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "nope")]) == 2
    assert "no such checkpoint folder or checkpoint root" in capsys.readouterr().err


def _blocks(lang: str, after: str) -> list[str]:
    section = DOCS.read_text(encoding="utf-8").split(after, 1)[1]
    return re.findall(rf"```{lang}\n(.*?)```", section, flags=re.S)


def test_docs_plain_tools_snippet_runs_as_written(tmp_path, monkeypatch) -> None:
    """docs/checkpoints.md's commands and python block, executed in a folder that holds what they name."""
    monkeypatch.chdir(tmp_path)
    trainer, folder = saved(tmp_path / "runs" / "ckpt", SaveConfig(strategy="sync", format="torch"))
    bash = _blocks("bash", "## Checkpoints with plain tools")[0]
    python = _blocks("python", "## Checkpoints with plain tools")[0]
    assert f"runs/ckpt/{folder.name}/state.pt" in python
    for line in bash.splitlines():
        argv = shlex.split(line, comments=True)
        assert argv[0] == "flashckpt"
        assert main(argv[1:]) == 0, line
    model = build_model(TINY, "sdpa", seed=7)
    exec(compile(python, "docs/checkpoints.md", "exec"), {"model": model})
    _same_weights(model, trainer.model)
