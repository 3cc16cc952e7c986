"""Session-wide plugins for every test path (``tests/`` and the notebooks under nbval):
``tests/require_all.py`` (``DISPATCH_NB_REQUIRE_ALL=1``: no skips), ``tests/parallel.py`` (the
groups of tests that share a process under ``pytest -n``, the order, Hypothesis's profiles) and
pytest's ``pytester`` (the suite's own rules are tested by running small pytest sessions)."""

pytest_plugins = ["tests.require_all", "tests.parallel", "pytester"]
