"""Sphinx configuration of the book (docs/book/build_book.py copies it into the staged source folder).

Offline by construction: myst-nb renders notebooks already executed by papermill (nb_execution_mode "off"), loads no
ipywidgets scripts (nb_ipywidgets_js empty), plotly.js is _static/plotly.min.js and MathJax 2 is _static/mathjax
(from the jupyter-server-mathjax package) instead of their CDNs. tests/test_book.py opens every page in Chromium
with every non-file request refused."""

project = "brorl_lab"
author = "brorl_lab contributors"
extensions = ["myst_nb"]
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "**/*.partial.ipynb"]

# notebooks: executed by build_book.py, rendered here
nb_execution_mode = "off"
nb_merge_streams = True  # one stdout / stderr block per cell, carriage returns resolved: a tqdm bar's last state
nb_ipywidgets_js = {}  # no require.js / html-manager from a CDN (build_book.py replaces widgets by a note)
nb_render_markdown_format = "myst"  # Markdown a cell displays (tables, $maths$) renders as the pages' own Markdown
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3  # "[text](#a-heading)" links in the pages resolve
myst_update_mathjax = False  # MathJax 2 below, configured by mathjax2_config

# MathJax 2.7 shipped by jupyter-server-mathjax (it carries the STIX-Web fonts only)
mathjax_path = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"
mathjax2_config = {
    "tex2jax": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]], "processEscapes": True,
                "processClass": "math|output_area", "ignoreClass": "document"},
    "HTML-CSS": {"availableFonts": [], "webFont": "STIX-Web", "imageFont": None, "preferredFont": None},
}

html_theme = "sphinx_book_theme"
html_title = "brorl_lab: the book"
html_static_path = ["_static"]
html_css_files = ["book.css"]
html_js_files = ["plotly.min.js", "book.js"]  # plotly.js once per page, before any figure's script runs; book.js
# fits every figure to its column once the page is laid out (and again when the window changes size)
html_theme_options = {"show_toc_level": 2, "navigation_with_keys": False}
html_show_sourcelink = False
html_copy_source = True  # the download button offers each page's source: a notebook page's .ipynb, executed
