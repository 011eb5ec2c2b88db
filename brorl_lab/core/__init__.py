"""core: the bottom layer. Typed, validated knobs (config), the rollout batch, registries, seeding, model loading,
paths, run directories, validation helpers and the shared-prefix attention used by engines and logprobs.
Imports nothing from the layers above (theory, rollout, rl, lab, cli); see ARCHITECTURE.md."""
