"""Compute providers: one module each, one interface (:mod:`.base`)."""
