"""Framework-free glue every adapter shares: the per-step session, loss check, cross-rank view."""
