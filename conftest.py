"""Session-wide plugins for every test path (``tests/`` and the notebooks under nbval):
``tests/require_all.py`` (``DISPATCH_NB_REQUIRE_ALL=1``: no skips) and pytest's ``pytester``
(the suite's own rules are tested by running small pytest sessions)."""

pytest_plugins = ["tests.require_all", "pytester"]
