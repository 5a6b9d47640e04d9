"""Evaluation: held-out rollouts, metrics, reports."""
