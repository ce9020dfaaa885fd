"""torch.compile's front door: `torch.compile(model, backend="hostir")` (`backend.py`).

Each FX graph is first made importable (`fx_rewrites.py`), then imported into a fusion
(`importer.py`: the walk of the graph, the values and their pieces) by the rules of the ops
the fusion dialect models (`rules/`), which this package imports so that they register.
"""

from hostir.frontend import rules  # noqa: F401  (the op rules register in the importer's RULES)
