"""Pretrained families read from Hugging Face folders and GGUF files: BERT encoders,
sentence embeddings, GPT-2 and LLaMA-family decoders (LLaMA, Mistral, Qwen2) with
generation and beam search, the Vision Transformer (ViT, DeiT), and their tokenizers."""
