"""The native surface (``/v1/segments``): segments as they are, by name.

Names map one to one onto segments; what this surface adds is HTTP:
``routes`` (create, append, read, state, seal, truncate, delete, list,
attributes, transactions, merges), ``params`` (strict parsing of headers,
query parameters and small JSON bodies) and ``sse`` (live tails as
Server-Sent Events).
"""

from app.native.routes import init_app

__all__ = ["init_app"]
