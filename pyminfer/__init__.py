from .api import LLM  # noqa: F401  (imports no server dependency)
