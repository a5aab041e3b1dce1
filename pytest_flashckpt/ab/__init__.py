"""A/B runs: two versions of the code measured interleaved on one machine and gated against each other, a
pull-request check that needs no stored baseline (``flashckpt ab``).

``trees`` turns a REF (a git commit or branch, or a folder holding ``pytest_flashckpt``) into a source tree;
``rounds`` runs the suite once per version per round, alternating which goes first, each in its own process
with ``PYTHONPATH`` at that tree; ``verdicts`` gates B's per-round samples against A's with the baseline gate's own
statistics and renders the markdown table.
"""
