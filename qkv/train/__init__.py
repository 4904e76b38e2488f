"""Training: the recipe, the loop, resuming, the run folder, the schedule, data parallel."""
