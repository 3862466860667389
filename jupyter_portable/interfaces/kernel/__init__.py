"""Inside the kernel: ``%workspace`` magics, the ipywidgets panel, auto-snapshots and the cell recorder."""
