"""What-if replay: each rank's dependency graph (:mod:`.graph`), an event-driven replay of it (:mod:`.simulate`)
and the what-if rewrites with the findings' impact (:mod:`.whatif`). Design: ``docs/replay.md``."""
