"""Diffusion language models: the embedded tiny model, its tokenizer, and the policy interface."""
