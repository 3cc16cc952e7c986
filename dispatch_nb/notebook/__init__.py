"""The notebook layer: ``%%chat`` / ``%chat`` (the only part of dispatch_nb that imports IPython
and ipywidgets). Its modules, in the order a cell meets them: ``docs/notebook.md``, "How a cell
runs". Nothing is imported here, so ``%load_ext dispatch_nb`` stays fast.
"""
