"""Hypothesis properties of the runtime checked against a model on every backend, and the planted mutants they must catch."""
