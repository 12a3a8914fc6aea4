"""Softmax, sampling and rejection on the device: the draft step's softmax and sample over vocabulary
slices, the Gumbel sampler, the rejection sampler, and the verify's rejection fused with its softmax."""
