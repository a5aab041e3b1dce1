"""pytest-flashckpt: measure and guard checkpointing strategies for FlashAttention GPT training.

Importing this package is cheap: nothing here imports torch. The measurement library lives in the
subpackages (``models``, ``probes``, ``runner``, ...), the pytest plugin in ``plugin``. Layers, data flow, the
metric vocabulary and how to add a metric, probe, strategy or report section: docs/architecture.md.
"""

__version__ = "0.1.0"
