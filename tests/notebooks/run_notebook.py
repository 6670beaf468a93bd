"""Executes a notebook in place of a user (nbclient), failing on the first error.

usage: run_notebook.py NOTEBOOK  (environment variables pass through to the kernel)
"""
import sys

import nbformat
from nbclient import NotebookClient

path = sys.argv[1]
notebook = nbformat.read(path, as_version=4)
NotebookClient(notebook, timeout=600, kernel_name="python3",
               resources={"metadata": {"path": str(__import__("pathlib").Path(path).parent)}}).execute()
print(f"executed {path}: {len(notebook.cells)} cells")
