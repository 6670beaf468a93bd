"""Executes a notebook in place of a user (nbclient), failing on the first error.

usage: run_notebook.py NOTEBOOK  (environment variables pass through to the kernel)

The kernel runs in a fresh temporary folder of its own (tempfile.mkdtemp, removed at the end),
so that a notebook that writes relative paths never writes into the source tree or into a folder
that another test (ctest -j) uses. Its inputs come from the STRATASIM_* environment variables
that tests/CMakeLists.txt sets.
"""
import shutil
import sys
import tempfile

import nbformat
from nbclient import NotebookClient

path = sys.argv[1]
notebook = nbformat.read(path, as_version=4)
workdir = tempfile.mkdtemp(prefix="stratasim-notebook-")
try:
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": workdir}}).execute()
finally:
    shutil.rmtree(workdir, ignore_errors=True)
print(f"executed {path}: {len(notebook.cells)} cells")
