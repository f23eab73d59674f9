"""Real environments: the ground truth the learned simulators are trained on and checked against."""
