"""The ``sluiceway`` command: a small dispatcher over the components' own CLIs, each imported
lazily (``sluiceway plan`` needs no sandbox, ``sluiceway sandbox`` no planner)."""
