"""study: the BroRL study built with the workbench's tools. The plateaued checkpoint (plateau), the ProRL and BroRL
arms branched from it (arms), one-change-at-a-time ablations (ablations), the per-prompt signal at each N
(mechanism), and the flagship notebook's facade (experiments). Imports any layer below (lab included); only the CLI
imports it."""
