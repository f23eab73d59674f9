"""Rewards and data for other trainers: TRL reward functions (`trl`), verl's `compute_score` (`verl`), and the
datasets both read (`export`). Each is a thin adapter over the domain rewards, so every metric has one definition."""
