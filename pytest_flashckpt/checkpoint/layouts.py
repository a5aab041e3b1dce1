"""The layout axis of a save: which files a checkpoint has and which tensor keys each holds.

``file``: every tensor in ``state.pt`` (or ``state.safetensors``); ``layerwise``: one file per block plus ``rest``
under ``layer_checkpoint_dir`` (default ``layers``); ``selected``: a full base first (one file, or per block with
``layer_checkpoint_dir``), then ``selected.pt`` with only the selected parameters (``select_params``), their
optimizer state and the global tensors (RNG); ``dcp``: a ``torch.distributed.checkpoint`` folder (one per block with
``layer_checkpoint_dir``). Blocks and embeddings come from the model's anatomy (``selection``), so every layout works
on any family, a Hugging Face model or a model with its own ``anatomy()``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from pytest_flashckpt.checkpoint import dcp_io
from pytest_flashckpt.checkpoint.formats import SUFFIX
from pytest_flashckpt.checkpoint.payload import Payload
from pytest_flashckpt.checkpoint.selection import blocks_prefix, layer_files, select_names, selective_keys
from pytest_flashckpt.checkpoint.state import CapturedState
from pytest_flashckpt.config.scenario import SaveConfig
from pytest_flashckpt.training import Trainer


class Layout(ABC):
    """Base: the files of one checkpoint (``files``), the base it is restored on top of (``base``), what it
    remembers after a commit (``committed``)."""

    def __init__(self, config: SaveConfig) -> None:
        self.config = config
        self.format = config.file_format  # torch | safetensors | dcp

    @abstractmethod
    def files(self, trainer: Trainer, state: CapturedState) -> dict[str, list[str]]:
        """Relative file (or DCP folder) -> the tensor keys it holds."""

    def base(self) -> str | None:
        return None

    def committed(self, name: str, payload: Payload) -> None:
        """Called after a successful commit of checkpoint ``name``."""

    def _full(self, trainer: Trainer, state: CapturedState, suffix: str, whole: str) -> dict[str, list[str]]:
        """Every tensor: in ``whole``, or one file per block with ``layer_checkpoint_dir``."""
        if self.config.layer_checkpoint_dir is not None:
            return layer_files(state, self.config.layer_checkpoint_dir, suffix, blocks_prefix(trainer.model))
        return {whole: list(state.tensors)}


class FileLayout(Layout):
    def files(self, trainer: Trainer, state: CapturedState) -> dict[str, list[str]]:
        return {f"state{SUFFIX[self.format]}": list(state.tensors)}


class LayerwiseLayout(Layout):
    def files(self, trainer: Trainer, state: CapturedState) -> dict[str, list[str]]:
        return layer_files(state, self.config.layer_checkpoint_dir or "layers", SUFFIX[self.format], blocks_prefix(trainer.model))


class SelectedLayout(Layout):
    def __init__(self, config: SaveConfig) -> None:
        super().__init__(config)
        self._base: str | None = None

    def files(self, trainer: Trainer, state: CapturedState) -> dict[str, list[str]]:
        suffix = SUFFIX[self.format]
        if self._base is None:
            return self._full(trainer, state, suffix, f"state{suffix}")
        keys = selective_keys(state, select_names(trainer.model, self.config.select_params))  # type: ignore[arg-type]
        return {f"selected{suffix}": keys}

    def base(self) -> str | None:
        return self._base

    def committed(self, name: str, payload: Payload) -> None:
        if payload.base is None:
            self._base = name


class DcpLayout(Layout):
    def files(self, trainer: Trainer, state: CapturedState) -> dict[str, list[str]]:
        return self._full(trainer, state, "", dcp_io.DCP_DIR)  # one DCP folder per block with layer_checkpoint_dir


LAYOUTS: dict[str, type[Layout]] = {"file": FileLayout, "layerwise": LayerwiseLayout, "selected": SelectedLayout, "dcp": DcpLayout}


def layout_for(config: SaveConfig) -> Layout:
    """The layout ``config.axes.layout`` names, built for ``config``."""
    return LAYOUTS[config.axes.layout](config)
