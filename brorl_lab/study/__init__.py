"""study: the BroRL study, built with the workbench's tools. Does broadening rollouts (N = 512) revive a ProRL run
that has stalled at N = 16? The modules, from the base up (each imports only those above it in this list, and any
layer below: core, theory, rollout, rl, lab):

    results    where a study's numbers come from: the provenance record beside every shipped results file
    recipe     the recipes (RECIPES, FLAGSHIP_RECIPE, the arm table ARM_TABLE), model aliases ("plateau"), the default families,
               recipe_config -> Config, open_trainer / check_same_config (resume a run only with its settings)
    rare       the study's definitions: rare success (0 < p <= RARE_SUCCESS_MAX_P = 1/16) and s_N(p)
    compare    the arms' names and colours (ARMS, ARM_NAMES, ARM_COLORS), summarize, compare_arms at a budget
    mechanism  per-prompt pass rates from 512 draws: which prompts carry a signal at N = 16 and at N = 512
    plateau    the branch point: train until the slope rule fires, gate on rare success, save data/plateau_model
    arms       the ProRL and BroRL arms branched from one config, run on one shared evaluation grid
    paid       the flagship paid in generated samples (issue 38): arms on a grid of generated-sample thresholds,
               and every reading declared before the run (collapse rule, change bounds, the mechanism's no-training
               control, the lr ablation, the takeoff race as time to a fixed level); its one reading:
               headline_reading
    revival    the floor's reading: its rule fixed before that run (brorl_revives) on the shared grid, in words
    ablations  the branch re-run with one knob changed at a time, each variant against its own ProRL arm
    runner     ONE runner: a study declared as data (Study: branch point, arms from recipe.ARM_TABLE, seeds, budget,
               grid, its one reading and thresholds) and run_study (declaration and pre-registration, the arm x seed
               grid, per-seed files with provenance, the reading); the CLI, notebook 02 and `make demo` call it
    regime     the regime map: the BroRL - ProRL gap per seed across settings spanning rho (named and constructed
               pools), run on the runner's machinery (RegimeMap, run_regime_map), its one reading regime_reading
    theorem    BroRL's Theorem 1 measured on the language model: one trainer update, decomposed per prompt, on the
               runner's machinery (theorem_study: declaration, provenance), its one reading theorem_reading
    render     results pages rendered from the shipped files (`python -m brorl_lab render`): templates with fields,
               deterministic figures, the README headline, and the provenance gate (LEGACY names pre-rule records)
    frontier   the rollout frontier (issue 43) as data and its readings: which N wins at each budget mark, lr rule, pilots
    allocation the allocation study (issue 44): per-prompt allocators against the frontier's shared uniform arms (read
               from its ledger, never re-run), run through the runner; its one reading allocation_table

Names (issue 42), one per quantity: an arm's N is ``rollouts_per_prompt`` and its prompts per step
``prompts_per_step`` (the Config fields); an *arm table* maps arm -> both (recipe.ARM_TABLE is the study's, the one
place its numbers are written; recipe.PAPER_ARMS the paper's); ``draws`` is the samples drawn per prompt to measure
its pass rate (rare.DRAWS, the BroRL arm's N); ``n_values`` the grid of N a theory sweep runs over. No module but
the recipe writes 16 or 512 (tests/test_architecture.py).

A config travels arms -> recipe -> trainer, never back through :mod:`.plateau`, whose only users are the CLI's
``plateau`` and ``reach`` commands (tests/test_architecture.py checks this order). The notebooks (01b, 02, 05, 06)
and the CLI import these modules directly; nothing else in brorl_lab imports the study.
"""
