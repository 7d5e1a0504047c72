"""Tokenizer stand-ins and chat-template rendering (the Kimi-K2 format)."""
