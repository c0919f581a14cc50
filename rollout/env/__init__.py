"""Environment adapters (tau2) and user simulators."""
