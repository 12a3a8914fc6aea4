"""Counter-based random numbers drawn on the device (per request, per position), so a captured
graph draws new numbers on every replay and seeded output does not depend on the batch."""
