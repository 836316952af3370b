"""The compiled hot path (``txn/protocol/_speedups.c``); everything else is in ``pyproject.toml``.

The extension is optional: without a C compiler the package installs and runs on its pure Python
path (``txn.protocol.batch.COMPILED`` says which one is in use). ``make setup`` installs the
compiler and the Python headers, so the set-up command always builds it.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("txn.protocol._speedups", ["txn/protocol/_speedups.c"], optional=True,
                             extra_compile_args=["-O2"])])
