"""Reading an environment: its interpreter, its distributions, the host it runs on."""
