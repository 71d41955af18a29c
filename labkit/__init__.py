"""labkit: a command-line lab around a nano-vLLM-style inference engine."""

__version__ = "0.1.0"
