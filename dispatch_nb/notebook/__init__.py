"""The notebook layer: the only part of dispatch_nb that imports IPython and ipywidgets.

* ``magics.py``  — ``%%chat`` / ``%chat`` and the ``ChatMagics`` traits (loaded by ``%load_ext``)
* ``state.py``   — ``KernelState``: adapters, caches, threads, ``Err``, the running cell (one per kernel)
* ``settings.py``— ``Settings``: the ``ChatMagics`` traits as a type (for the checker only)
* ``constants.py`` — the option choices (formats, cache and live modes, subcommands); imports nothing
* ``cell.py``    — one ``%%chat`` execution, start to finish: ``CellRun`` (plan / run / finish / record)
* ``options.py`` — the checks of a ``%%chat`` line's options (``-o``, limits, ``--tools``, ``--schema``)
* ``each.py``    — ``%%chat --each``: one prompt over the rows of a list or DataFrame
* ``prompt.py``  — ``{expression}`` interpolation, ``In``/``Out``/``Err`` references, summaries
* ``threads.py`` — conversation memory; re-running a cell replaces its turn
* ``runner.py``  — model calls on worker threads, events handed to the kernel's thread, Ctrl-C
* ``live.py``    — the live view (widgets, ``display_id`` updates, plain text)
* ``display.py`` — the static final output, comparisons, short readable errors
* ``login.py``   — the GitHub device-login view
* ``commands.py``— ``%chat login|logout|status|models|history|reset``

Nothing is imported here, so ``%load_ext dispatch_nb`` stays fast.
"""
