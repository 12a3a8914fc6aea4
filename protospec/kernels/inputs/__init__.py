"""The draft loop's and the decode's inputs built on the device: advance_step (vLLM's change),
the first draft step, the verify's inputs, the target-only decode's advance, slot lookups, and
the n-gram proposer's match."""
