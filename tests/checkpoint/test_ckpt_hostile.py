"""Hostile checkpoints: files written by someone who wants code run, or files read or written outside the folder.

An attacker who can write a checkpoint's files can also re-hash ``manifest.json``, so every case here re-hashes it
(the manifest's sha256 is not a signature). Each planted file is tried through every path that reads a checkpoint
(load, resume, export, inspect, the sharded loads and the reshard proof's load) and must give one clear error naming
the file or entry, no traceback, no marker file (nothing run), and nothing read from outside the folder. A control
test shows each planted payload does run under a plain ``pickle.load`` / ``torch.load(weights_only=False)``, so the
refusals are not vacuous.
"""

from __future__ import annotations

import json
import operator
import os
import pickle
import shlex
import shutil
from pathlib import Path

import pytest

from ckpt_helpers import make_trainer
from pytest_flashckpt.checkpoint import CheckpointError, Checkpointer, CheckpointFallbackWarning, CorruptCheckpointError
from pytest_flashckpt.checkpoint import dcp_io, safe_dcp
from pytest_flashckpt.checkpoint.export import export_weights
from pytest_flashckpt.checkpoint.inspection import inspect_checkpoint
from pytest_flashckpt.checkpoint.loading import load_blocks, load_into, load_model_tensors, read_checkpoint, resume_latest
from pytest_flashckpt.checkpoint.manifest import MANIFEST, sha256_file
from pytest_flashckpt.cli import main
from pytest_flashckpt.config.scenario import SaveConfig
from pytest_flashckpt.distributed import reshard, sharded_store


class _Call:
    """Pickles as ``fn(*args)``: what a crafted file's ``__reduce__`` does."""

    def __init__(self, fn, *args) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def _payload(marker: Path, then: object) -> _Call:
    """Unpickled: runs ``touch marker`` through os.system, then evaluates to ``then`` (so a load would 'succeed')."""
    return _Call(operator.itemgetter(1), (_Call(os.system, f"touch {shlex.quote(str(marker))}"), then))


def rehash(folder: Path, extra: dict[str, Path] | None = None) -> None:
    """What an attacker does after changing files: rewrite the manifest's sizes and sha256 (and add entries)."""
    manifest = json.loads((folder / MANIFEST).read_text())
    for rel in list(manifest["files"]):
        if (folder / rel).is_file():
            manifest["files"][rel] = {"bytes": (folder / rel).stat().st_size, "sha256": sha256_file(folder / rel)}
    for rel, path in (extra or {}).items():
        manifest["files"][rel] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
    (folder / MANIFEST).write_text(json.dumps(manifest))


def plant_metadata(dcp_dir: Path, marker: Path) -> None:
    real = pickle.loads((dcp_dir / ".metadata").read_bytes())  # written by this test's own save: trusted
    (dcp_dir / ".metadata").write_bytes(pickle.dumps(_payload(marker, real)))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, Path]:
    """Checkpoint roots written once per module (each test works on a copy): two dcp saves, one sharded save,
    two sync torch saves and a layer-wise one."""
    base = tmp_path_factory.mktemp("pristine")
    roots = {}
    for name, config, saves in (("dcp", SaveConfig(strategy="dcp"), 2), ("sync", SaveConfig(strategy="sync"), 2),
                                ("layerwise", SaveConfig(strategy="layerwise"), 1)):
        trainer = make_trainer()
        with Checkpointer(base / name, config) as ckpt:
            for _ in range(saves):
                trainer.train_step()
                ckpt.save(trainer)
        roots[name] = base / name
    trainer = make_trainer()
    trainer.train_step()
    with dcp_io.process_group(), sharded_store.ShardedCheckpointer(base / "w1") as ckpt:
        ckpt.save(trainer)
    roots["sharded"] = base / "w1"
    return roots


def copy_of(pristine: dict[str, Path], name: str, tmp_path: Path) -> tuple[Path, list[Path]]:
    root = tmp_path / pristine[name].name
    shutil.copytree(pristine[name], root, symlinks=True)
    return root, sorted(p for p in root.iterdir() if p.name.startswith("ckpt-"))


def _cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text
    return code, text


# -- 1. no code from a checkpoint -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_control_the_planted_metadata_runs_its_payload_under_a_plain_unpickler(pristine, tmp_path) -> None:
    root, (_, newer) = copy_of(pristine, "dcp", tmp_path)
    marker = tmp_path / "pwned"
    plant_metadata(newer / "dcp", marker)
    md = pickle.loads((newer / "dcp" / ".metadata").read_bytes())  # what torch's FileSystemReader does
    assert marker.exists() and type(md).__name__ == "Metadata"


def test_a_real_metadata_file_names_only_allowed_globals(pristine) -> None:
    for root in (pristine["dcp"], pristine["sharded"]):
        for path in root.rglob(".metadata"):
            assert type(safe_dcp.read_metadata(path.parent)).__name__ == "Metadata"


def test_crafted_dcp_metadata_is_refused_by_every_single_process_read_path(pristine, tmp_path, capsys) -> None:
    root, (older, newer) = copy_of(pristine, "dcp", tmp_path)
    marker = tmp_path / "pwned"
    plant_metadata(newer / "dcp", marker)
    rehash(newer)
    refused = r"\.metadata: refused: this DCP metadata pickle asks for operator\.itemgetter, which is not one of"
    for read in (lambda: load_into(make_trainer(), newer), lambda: read_checkpoint(newer),
                 lambda: load_model_tensors(make_trainer().model, newer), lambda: export_weights(root, tmp_path / "w.safetensors")):
        with pytest.raises(CorruptCheckpointError, match=refused):
            read()
    with pytest.warns(CheckpointFallbackWarning, match=refused):
        assert resume_latest(make_trainer(), root).folder == older
    found = inspect_checkpoint(root)
    assert not found.verified and "check: CORRUPT" in found.lines[-1] and "refused" in found.lines[-1]
    code, text = _cli(capsys, "export", str(root), str(tmp_path / "w.pt"))
    assert code == 2 and "refused" in text and not (tmp_path / "w.pt").exists()
    code, text = _cli(capsys, "inspect", str(newer))
    assert code == 1 and "refused" in text
    assert not marker.exists()


def test_crafted_metadata_of_a_sharded_checkpoint_is_refused_by_every_sharded_read_path(pristine, tmp_path) -> None:
    root, (folder,) = copy_of(pristine, "sharded", tmp_path)
    marker = tmp_path / "pwned"
    plant_metadata(folder / "dcp", marker)
    rehash(folder)
    with dcp_io.process_group():
        for read in (lambda: sharded_store.load_plain(make_trainer(), folder), lambda: sharded_store.load(make_trainer(), folder),
                     lambda: reshard.load_phase(tmp_path, [1], 0)):
            with pytest.raises(CheckpointError, match=r"\.metadata: refused"):
                read()
    assert "refused" in inspect_checkpoint(folder).lines[-1]
    assert not marker.exists()


def test_a_non_tensor_dcp_entry_is_read_with_weights_only(tmp_path, monkeypatch) -> None:
    """DCP's default planner reads non-tensor entries (an optimizer's lr) with torch.load(weights_only=False)."""
    marker = tmp_path / "pwned"
    state_of = sharded_store.training_state

    def poisoned(trainer, options=None):
        state = state_of(trainer, options)  # saves flatten the optimizer: one lr entry per parameter
        state["optim"][next(key for key in state["optim"] if key.endswith(".lr"))] = _payload(marker, 1e-3)
        return state

    trainer = make_trainer()
    trainer.train_step()
    with dcp_io.process_group():
        monkeypatch.setattr(sharded_store, "training_state", poisoned)
        with sharded_store.ShardedCheckpointer(tmp_path / "root") as ckpt:
            folder = ckpt.save(trainer).folder
        monkeypatch.setattr(sharded_store, "training_state", state_of)
        with pytest.raises(CheckpointError, match=r"optim\.param_groups\.[\w.]+\.lr'?: refused by torch\.load\(weights_only=True\)"):
            sharded_store.load_plain(make_trainer(), folder)
    assert not marker.exists()
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner  # control: torch's own planner runs it

    with dcp_io.process_group():
        state = sharded_store.training_state(make_trainer(), sharded_store.SAVE_OPTIONS)
        import torch.distributed.checkpoint as dcp

        dcp.load(state, checkpoint_id=str(folder / "dcp"), planner=DefaultLoadPlanner())
    assert marker.exists()


def test_a_dcp_shard_file_outside_the_folder_is_refused(pristine, tmp_path) -> None:
    root, (_, newer) = copy_of(pristine, "dcp", tmp_path)
    md = pickle.loads((newer / "dcp" / ".metadata").read_bytes())
    for info in md.storage_data.values():
        info.relative_path = "../../../outside.distcp"
    (newer / "dcp" / ".metadata").write_bytes(pickle.dumps(md))
    rehash(newer)
    with pytest.raises(CorruptCheckpointError, match=r"DCP shard file .* '\.\./\.\./\.\./outside\.distcp' refused: it climbs out"):
        load_into(make_trainer(), newer)


def test_a_shard_file_the_manifest_does_not_list_is_refused(pristine, tmp_path) -> None:
    root, (_, newer) = copy_of(pristine, "dcp", tmp_path)
    shard = next((newer / "dcp").glob("*.distcp"))
    shutil.copy(shard, newer / "dcp" / "unlisted.distcp")
    md = pickle.loads((newer / "dcp" / ".metadata").read_bytes())
    for info in md.storage_data.values():
        info.relative_path = "unlisted.distcp"
    (newer / "dcp" / ".metadata").write_bytes(pickle.dumps(md))
    rehash(newer)
    with pytest.raises(CorruptCheckpointError, match="'unlisted.distcp', which the checkpoint's manifest does not list"):
        read_checkpoint(newer)


def test_garbage_metadata_and_meta_json_disagreeing_with_it_are_clear_errors(pristine, tmp_path) -> None:
    root, (older, newer) = copy_of(pristine, "dcp", tmp_path)
    (newer / "dcp" / ".metadata").write_bytes(b"\x80\x04not a pickle")
    rehash(newer)
    with pytest.raises(CorruptCheckpointError, match=r"\.metadata: not a readable DCP metadata file"):
        read_checkpoint(newer)
    meta = json.loads((older / "meta.json").read_text())
    first = next(iter(meta["tensors"]))
    meta["tensors"][first]["shape"] = [10**6, 10**6]  # would allocate 4 TB before DCP complains
    (older / "meta.json").write_text(json.dumps(meta))
    rehash(older)
    with pytest.raises(CorruptCheckpointError, match="in meta.json but not in the DCP metadata"):
        read_checkpoint(older)


# -- 2. confined paths ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("entry", ["../../outside.txt", "ABSOLUTE"])
def test_a_manifest_entry_outside_the_folder_is_refused_not_hashed(entry, pristine, tmp_path) -> None:
    root, (_, newer) = copy_of(pristine, "sync", tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    entry = str(outside) if entry == "ABSOLUTE" else entry
    rehash(newer, extra={entry: outside})  # the correct sha256 of the outside file
    with pytest.raises(CorruptCheckpointError, match=f"manifest.json entry '{entry}' refused"):
        load_into(make_trainer(), newer)
    found = inspect_checkpoint(newer)
    assert not found.verified and "refused" in found.lines[-1]


def test_a_state_file_symlinked_out_of_the_folder_is_refused(pristine, tmp_path) -> None:
    root, (older, newer) = copy_of(pristine, "sync", tmp_path)
    outside = tmp_path / "elsewhere.pt"
    shutil.move(newer / "state.pt", outside)
    (newer / "state.pt").symlink_to(outside)  # same bytes: the manifest's sha256 still matches
    with pytest.raises(CorruptCheckpointError, match="'state.pt' refused: it resolves outside the folder"):
        load_into(make_trainer(), newer)
    assert "refused" in inspect_checkpoint(newer).lines[-1]
    with pytest.warns(CheckpointFallbackWarning):
        assert resume_latest(make_trainer(), root).folder == older


def test_a_meta_json_file_outside_the_folder_or_unlisted_is_refused(pristine, tmp_path) -> None:
    root, (older, newer) = copy_of(pristine, "sync", tmp_path)
    shutil.copy(newer / "state.pt", tmp_path / "outside.pt")
    meta = json.loads((newer / "meta.json").read_text())
    for spec in meta["tensors"].values():
        spec["file"] = "../../outside.pt"
    (newer / "meta.json").write_text(json.dumps(meta))
    rehash(newer)
    with pytest.raises(CorruptCheckpointError, match="meta.json file '../../outside.pt' refused: it climbs out"):
        read_checkpoint(newer)
    shutil.copy(older / "state.pt", older / "extra.pt")  # inside, but never listed in the manifest
    meta = json.loads((older / "meta.json").read_text())
    for spec in meta["tensors"].values():
        spec["file"] = "extra.pt"
    (older / "meta.json").write_text(json.dumps(meta))
    rehash(older)
    with pytest.raises(CorruptCheckpointError, match="meta.json names 'extra.pt', which manifest.json does not list"):
        read_checkpoint(older)


@pytest.mark.parametrize("target", ["/etc", "/", "../outside", "ckpt-000001-step00000001/../.."])
def test_a_latest_leading_out_of_the_root_is_never_followed(target, pristine, tmp_path, capsys) -> None:
    root, (older, newer) = copy_of(pristine, "sync", tmp_path)
    (root / "latest").write_text(target + "\n")
    with pytest.warns(CheckpointFallbackWarning, match="latest target .* refused"):
        assert resume_latest(make_trainer(), root).folder == newer  # the newest complete one, inside the root
    found = inspect_checkpoint(root)
    assert not found.verified and len(found.lines) == 2 and "refused" in found.lines[-1]
    code, text = _cli(capsys, "inspect", str(root))
    assert code == 1 and len(text.splitlines()) == 2
    code, text = _cli(capsys, "export", str(root), str(tmp_path / "w.safetensors"))
    assert code == 2 and "latest target" in text
    with dcp_io.process_group():
        with pytest.raises(CorruptCheckpointError, match="refused"):
            sharded_store.latest(root)
    shutil.rmtree(older), shutil.rmtree(newer)
    with pytest.raises(CheckpointError, match="no valid checkpoint in .*latest target"):
        resume_latest(make_trainer(), root)


def test_a_checkpoint_folder_symlinked_out_of_the_root_is_not_followed(pristine, tmp_path) -> None:
    root, (older, newer) = copy_of(pristine, "sync", tmp_path)
    shutil.move(newer, tmp_path / "elsewhere")
    newer.symlink_to(tmp_path / "elsewhere")
    with pytest.warns(CheckpointFallbackWarning, match="checkpoint folder .* resolves outside"):
        assert resume_latest(make_trainer(), root).folder == older


def test_a_selective_base_outside_the_root_is_refused(pristine, tmp_path) -> None:
    root, (older, newer) = copy_of(pristine, "sync", tmp_path)
    manifest = json.loads((newer / MANIFEST).read_text())
    manifest["base"] = "../../elsewhere"
    (newer / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpointError, match="base named in .* '../../elsewhere' refused"):
        read_checkpoint(newer)


@pytest.mark.parametrize("value", ["../../escaped", "/tmp/escaped", "layers/../../x", ".", ""])
def test_layer_checkpoint_dir_outside_the_checkpoint_is_refused_at_config_time(value) -> None:
    with pytest.raises(ValueError, match="layer_checkpoint_dir: .* must be"):
        SaveConfig(layer_checkpoint_dir=value)


def test_layer_checkpoint_dir_in_a_suite_is_refused_naming_file_and_key(tmp_path) -> None:
    from pytest_flashckpt.config.suites import load_suite

    suite = tmp_path / "bad.yaml"
    suite.write_text("scenarios:\n  - name: esc\n    model: tiny\n    checkpoint: {layer_checkpoint_dir: '../../escaped'}\n    measure: [checkpoint]\n")
    with pytest.raises(Exception, match=r"(?s)bad\.yaml.*layer_checkpoint_dir: '\.\./\.\./escaped' must be free of '\.\.'") as info:
        load_suite(suite)
    assert "Traceback" not in str(info.value)


def test_layerwise_block_files_are_inside_listed_and_verified(pristine, tmp_path) -> None:
    root, (folder,) = copy_of(pristine, "layerwise", tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())
    blocks = sorted(rel for rel in manifest["files"] if "/block_" in rel)
    assert blocks and all((folder / rel).resolve().is_relative_to(folder.resolve()) for rel in blocks)
    data = bytearray((folder / blocks[0]).read_bytes())
    data[-30] ^= 0xFF
    (folder / blocks[0]).write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=f"{blocks[0]}: sha256 does not match"):
        load_blocks(make_trainer().model, folder, [0])


def test_a_latest_symlinked_out_of_the_root_is_not_read(pristine, tmp_path) -> None:
    root, (older, newer) = copy_of(pristine, "sync", tmp_path)
    (tmp_path / "secret").write_text("the first line of a file outside\n")
    (root / "latest").unlink()
    (root / "latest").symlink_to(tmp_path / "secret")
    with pytest.warns(CheckpointFallbackWarning, match="pointer 'latest' refused: it resolves outside") as caught:
        assert resume_latest(make_trainer(), root).folder == newer
    assert "first line" not in str(caught[0].message)


@pytest.mark.slow
def test_no_reader_in_the_library_unpickles_by_itself() -> None:
    """Source guard: torch.load only with weights_only=True, no pickle.load/loads, DCP reads only via safe_dcp.
    (Run on the tree before this guard existed, it names dcp_io.py's and sharded_store.py's plain dcp.load.)"""
    import ast

    package = Path(__file__).resolve().parents[2] / "pytest_flashckpt"
    offenders = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else getattr(node.func.value, "attr", "")
            call, where = f"{owner}.{node.func.attr}", f"{path.relative_to(package)}:{node.lineno}"
            weights_only = next((k.value for k in node.keywords if k.arg == "weights_only"), None)
            if call == "torch.load" and not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                offenders.append(f"{where} torch.load without weights_only=True")
            if call in ("pickle.load", "pickle.loads", "pickle.Unpickler"):
                offenders.append(f"{where} {call}")
            if call == "dcp.load" and path.name != "safe_dcp.py":
                offenders.append(f"{where} dcp.load outside safe_dcp")
    assert offenders == []


@pytest.mark.parametrize("damage", ["chunks", "offset", "transform", "missing"])
def test_metadata_of_allowed_classes_but_odd_fields_is_a_clear_error(damage, pristine, tmp_path) -> None:
    root, (_, newer) = copy_of(pristine, "dcp", tmp_path)
    md = pickle.loads((newer / "dcp" / ".metadata").read_bytes())
    entry = next(iter(md.state_dict_metadata.values()))
    info = next(iter(md.storage_data.values()))
    if damage == "chunks":
        entry.chunks = 5
    elif damage == "offset":
        info.offset = -1
    elif damage == "transform":
        info.transform_descriptors = ["zstd"]
    else:
        del md.storage_data
    (newer / "dcp" / ".metadata").write_bytes(pickle.dumps(md))
    rehash(newer)
    with pytest.raises(CorruptCheckpointError, match=r"\.metadata: not DCP metadata as torch writes it"):
        read_checkpoint(newer)


def test_metadata_that_sets_attributes_of_an_allowed_class_is_refused(pristine, tmp_path) -> None:
    from torch.distributed.checkpoint.metadata import Metadata

    root, (_, newer) = copy_of(pristine, "dcp", tmp_path)
    real = (newer / "dcp" / ".metadata").read_bytes()
    # protocol 4 by hand: push the class Metadata, BUILD it with slot state {"pwned_attr": "patched"}, POP; then the
    # real metadata follows (its own PROTO dropped), so a plain unpickler returns it after patching the class
    patch = b"\x80\x04\x8c\x25torch.distributed.checkpoint.metadata\x8c\x08Metadata\x93N}\x8c\x0apwned_attr\x8c\x07patched\x73\x86b0"
    assert type(pickle.loads(patch + real[2:])) is Metadata and Metadata.pwned_attr == "patched"  # control
    del Metadata.pwned_attr
    (newer / "dcp" / ".metadata").write_bytes(patch + real[2:])
    rehash(newer)
    with pytest.raises(CorruptCheckpointError, match="sets attributes of the class Metadata itself"):
        read_checkpoint(newer)
    assert not hasattr(Metadata, "pwned_attr")
