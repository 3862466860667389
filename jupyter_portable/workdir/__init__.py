"""The only owner of a copy's ``.portable/``: its config, locks and atomic writes, the
lifecycle file, the next action and the pending files."""
