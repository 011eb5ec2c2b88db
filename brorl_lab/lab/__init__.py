"""lab: the workbench's tools. Reading runs (tracking), DataFrame comparisons and verdicts (analysis), plotly figures
(plots), ipywidgets (widgets), offline HTML reports (report), papermill sweeps and the iso-compute planner (sweep).
Imports any layer below; nothing below imports it, and it never imports the study above it (:mod:`brorl_lab.study`)."""
