"""What the commands in scripts/ run: the native stack (up), the fault soak, the GPU smoke test."""
