"""Models: loading (`load`), the policy forward pass (`forward`), the offline tiny model (`tiny`), GGUF import (`gguf`), the vocabulary guard (`tokens`)."""
