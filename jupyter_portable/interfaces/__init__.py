"""How people reach the work: the ``jupyter portable`` command, the kernel's ``%workspace``
magics and widgets, and the Jupyter server extension. Nothing imports this layer."""
