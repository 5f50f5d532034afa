"""Partitioning: which nodes the accelerator runs (optable), how they are grouped (plan), and
how each group becomes one MLUFusionBlock node (collapse)."""
