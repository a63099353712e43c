"""rigbook: provision and verify homelab multi-GPU LLM inference boxes."""

__version__ = "0.1.0"
