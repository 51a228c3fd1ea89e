"""Part 3: Llama 3."""
