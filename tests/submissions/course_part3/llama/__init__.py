from .generation import Generation
from .model import Llama, ModelArgs
from .tokenizer import Tokenizer

__all__ = ["Generation", "Llama", "ModelArgs", "Tokenizer"]
