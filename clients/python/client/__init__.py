"""segstore's Python client: speaks HTTP only and never imports ``engine``."""
