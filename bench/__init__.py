"""Benchmarks: each module has `main(out_dir="runs/bench")` and writes a markdown report (and plots) there."""
