"""What every lab shares: devices, timing, telemetry, results, rendering, specs, models."""
