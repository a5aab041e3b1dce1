"""The Llama family (Llama 2/3 shapes): RMSNorm, SwiGLU, rotary positions, grouped-query attention."""

from pytest_flashckpt.models.llama.model import Llama, LlamaConfig, llama_anatomy

__all__ = ["Llama", "LlamaConfig", "llama_anatomy"]
