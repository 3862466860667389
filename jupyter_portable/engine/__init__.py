"""The engine: store <-> directory, no Jupyter.

Snapshot, restore, lazy fetch, verify and fsck, checkpoints, the runtime record and the
Workspace API.
"""
