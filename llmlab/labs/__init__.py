"""One module per lab. Each exposes `Config` (with `.quick()`), `run(cfg, device, progress)`."""
