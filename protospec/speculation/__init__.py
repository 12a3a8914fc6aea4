"""The speculative step: draft loops, commit policies, sampling, rejection, random numbers."""
