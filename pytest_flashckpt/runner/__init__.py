"""Running scenarios: synthetic data, training steps, the measurement passes, and the Result they produce."""
