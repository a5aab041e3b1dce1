"""A CPU stand-in for flash-attn >= 2.7: importing it registers ``flashattn::_flash_attn_forward`` (a custom op
with a ``dropout_p`` argument, as the real one) and ``flash_attn_func`` calls it through an autograd Function."""

from flash_attn.flash_attn_interface import flash_attn_func  # noqa: F401

__version__ = "2.7.0+fake"
