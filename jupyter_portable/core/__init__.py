"""Records and rules with no I/O and no Jupyter: tested in microseconds."""
