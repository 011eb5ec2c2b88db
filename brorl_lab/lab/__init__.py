"""lab: the workbench on top. Reading runs (tracking), DataFrame comparisons and verdicts (analysis), plotly figures
(plots), ipywidgets (widgets), papermill sweeps and the iso-compute planner (sweep), and the flagship studies
(experiments). Imports any layer below; nothing below imports it."""
