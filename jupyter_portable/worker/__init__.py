"""The worker: what runs on an allocation to bring a workspace's environment and files back."""
