"""Continue, Stop and Loss over the persisted state machine; routes, reservations, the
budget, the monitor, the state view and the kernel provisioner."""
