"""llmlab: hands-on, measured labs for LLM inference on your own hardware."""

__version__ = "0.1.0"
