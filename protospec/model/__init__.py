"""One Llama and its paged KV cache: architecture config, loader, forward, attention, inputs, CUDA graphs."""
