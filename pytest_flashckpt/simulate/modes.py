"""The modes a simulated step runs under besides the probe: mixed precision's autocast model, and the CPU kernels'
output dtypes where meta's differ.

- ``CpuKernelDtypes`` (target ``cpu``): the CPU's ``native_layer_norm`` returns its saved mean and rstd in the
  input's dtype for bfloat16 / float16 inputs, where the meta kernel returns float32 (as CUDA's does). Without it a
  bf16 CPU prediction over-counted every LayerNorm's statistics (0 of 32 exact, +3.8 to +26.9 KB, issue 21). It
  runs *below* the probe (entered before it), so the probe sees only the CPU's dtypes.
- ``simulate.autocast`` (precision ``mixed``): the function mode that applies autocast's cast policy to meta
  tensors.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_flashckpt.core.registry import PRECISIONS as _PRECISION_NAMES

PRECISIONS = tuple(_PRECISION_NAMES)  # their meaning: core.registry.PRECISIONS

_LOW = (torch.bfloat16, torch.float16)


class CpuKernelDtypes(TorchDispatchMode):
    """Meta kernels with the CPU kernels' output dtypes (the ones that differ and that a GPT step calls)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.native_layer_norm.default and args[0].dtype in _LOW:
            y, mean, rstd = out
            return y, mean.to(args[0].dtype), rstd.to(args[0].dtype)
        return out


@dataclass
class StepModes:
    """Modes entered outside the probe (dispatch modes there run below it: the probe sees their results)."""

    modes: list = field(default_factory=list)

    @contextmanager
    def outside_probe(self):
        with ExitStack() as stack:
            for mode in self.modes:
                stack.enter_context(mode)
            yield


def step_modes(target: str, precision: str) -> StepModes:
    """The modes of a simulated step (its warm-up and measured steps) on ``target`` in ``precision``."""
    modes = StepModes()
    if target == "cpu":
        modes.modes.append(CpuKernelDtypes())
    if precision == "mixed":
        from pytest_flashckpt.simulate.autocast import meta_autocast

        modes.modes.append(meta_autocast(target))
    return modes
