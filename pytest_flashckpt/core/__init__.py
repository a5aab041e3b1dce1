"""The bottom of the library: the metric vocabulary, registered names, verdict words, the run record, helpers.

Torch-free and pytest-free; every other package may import it, it imports none of them (docs/architecture.md).
"""
