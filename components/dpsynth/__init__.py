"""dpsynth: differentially private GANs with an (epsilon, delta) guarantee an auditor can check."""

__version__ = "0.1.0"
