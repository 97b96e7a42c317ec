"""Two modules defining endpoints of the same name (a name must never be a limit key)."""
