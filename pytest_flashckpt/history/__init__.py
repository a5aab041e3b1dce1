"""History: change points in a series of suite runs (``flashckpt history DIR``).

``series`` reads a folder of ``results.json`` (CI artifacts) into one series per scenario and metric, ordered by
the run timestamps they record; ``changes`` finds change points with Apache Otava's e-divisive method (optional:
``pip install --no-deps apache-otava==0.8.0 scipy``); ``render`` writes the markdown and the trend plots.
"""
