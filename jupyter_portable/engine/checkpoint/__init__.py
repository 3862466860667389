"""Checkpoints: the write check and the registry."""
