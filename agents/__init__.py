"""Consumers of the learned simulators: SB3 agents, the web lookahead agent, policy evaluation."""
