"""Hugging Face causal LMs as a model family: built from a config (never a download), anatomy discovered.

``build_hf_model(config, backend)`` builds ``AutoModelForCausalLM.from_config`` with random weights (from a seed),
the attention implementation of the scenario's kernel, and the project's training-step call ``model(tokens,
targets) -> loss`` (``loss_forward``). ``discover_anatomy`` knows GPT-2 and Llama layouts and is registered with
``models.anatomy.register_discoverer`` when ``pytest_flashckpt`` is imported (``models.families``, which imports
this package only when a transformers model is met), so every strategy that reads a model's anatomy works on a
Hugging Face model the user built too; ``explain_anatomy`` says what could not be decided for any other layout, and
``stated_anatomy`` turns a suite's ``anatomy:`` keys into one.

``models.hf.card.hf_card`` turns a config into the card the simulator and FSDP ranks read (``HFCard``: layers,
widths, positions, and ``build``, the same builder); ``models.hf.attention`` registers the explicit kernel ops with
transformers' ``AttentionInterface``, so a model simulated on ``meta`` runs the flash / mem-efficient kernel's op
instead of SDPA's math path.

Needs the optional extra ``pytest-flashckpt[hf]`` (transformers); importing this package without it raises
``HFUnavailable`` (an ImportError) with the install line.
"""

from pytest_flashckpt.models.hf.anatomy import discover_anatomy, explain_anatomy, stated_anatomy
from pytest_flashckpt.models.hf.build import HFUnavailable, build_hf_model, hf_config, loss_forward

__all__ = ["HFUnavailable", "build_hf_model", "discover_anatomy", "explain_anatomy", "hf_config", "loss_forward", "stated_anatomy"]
