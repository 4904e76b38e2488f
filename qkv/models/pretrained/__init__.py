"""Pretrained families read from Hugging Face folders: BERT encoders, sentence embeddings,
GPT-2 decoders with generation and beam search, and their tokenizers."""
