"""Where decisions are made: Redis (scripts) or, later, in process."""
