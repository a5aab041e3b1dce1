"""``flashckpt fit``: the layouts of a model that fit a device, ranked by a step-time model (issue 32 item 5).

The search (``fit.search``) enumerates layouts per GPU count (``fit.candidates``), prunes them by the exact bytes of
their sharded training state, ranks the survivors by a time model (``fit.time_model`` over the device and
interconnect table of ``fit.hardware``), and simulates the per-rank peak of the best ones with the real engine under
fake mode (``fit.memory``: one memory source per layout axis) until enough fit. Each layout's checkpoint cost
(``fit.checkpoint_cost``) is computed beside it, and the chosen one is written as a suite scenario and a
torchtitan-style TOML (``fit.writers``). The model comes from a card, a Hugging Face config.json or a torchtitan TOML
(``fit.model_input``). docs/fit.md.
"""
