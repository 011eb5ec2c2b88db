"""Shared by the notebook generator scripts (build_*.py): collect cells, write a validated .ipynb, outputs cleared.

    nb = NotebookBuilder()
    nb.md("# Title")
    nb.code("steps = 10", tags=["parameters"])
    nb.write(path)       # kernelspec python3 + language_info (papermill needs both), stable cell ids
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}
LANGUAGE_INFO = {"name": "python", "pygments_lexer": "ipython3"}


class NotebookBuilder:
    def __init__(self):
        self.cells = []

    def md(self, text: str) -> None:
        self.cells.append(new_markdown_cell(text.strip()))

    def code(self, text: str, **metadata) -> None:
        self.cells.append(new_code_cell(text.strip(), metadata=metadata))

    def write(self, out: Path) -> Path:
        for i, cell in enumerate(self.cells):
            cell.id = f"cell-{i:02d}"  # stable ids: regenerating gives the same file
        nb = new_notebook(cells=self.cells, metadata={"kernelspec": KERNELSPEC, "language_info": LANGUAGE_INFO})
        nbformat.validate(nb)
        Path(out).write_text(nbformat.writes(nb))
        return Path(out)
