"""A/B runs: two versions of the code measured interleaved on one machine and gated against each other, a
pull-request check that needs no stored baseline (``flashckpt ab``).

``trees`` turns each side into a source tree: ``--a/--b REF`` always a git commit / branch / tag (checked out clean),
``--a-path/--b-path DIR`` a folder run as it is; ``gitstate`` says what git knows of a folder (HEAD, uncommitted
changes); ``suite_source`` reads the gating suite from A's tree (``--suite-from a``) or as the command finds it;
``rounds`` runs the suite once per version per round, alternating which goes first, each in its own process with
``PYTHONPATH`` at that tree; ``provenance`` names what ran (SHAs, folders, profiles, versions) and refuses two
profiles; ``verdicts`` gates B's per-round samples against A's with the baseline gate's own statistics and renders
``ab.md``; ``command`` is the ``flashckpt ab`` options and flow.
"""
