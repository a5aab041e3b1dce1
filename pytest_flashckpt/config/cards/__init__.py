"""The card schema of every model family: one module per family, named as the family (``gpt.py``, ``llama.py``),
holding its frozen dataclass and ``CARD = <that class>``. ``config.model_card`` discovers them with ``pkgutil``: a
new family adds its module here and no central list (docs/architecture.md, "A model family")."""
