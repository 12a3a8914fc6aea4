"""python -m protospec.train: a draft/target Llama pair trained on the running interpreter's stdlib."""
