"""Installs the fault hooks (portable_faults) into every Python a test starts with
``portable_faults.fault_env``: this folder is then first on its PYTHONPATH."""

import portable_faults

portable_faults.install()
