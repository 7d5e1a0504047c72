"""Prompts: the dataset reader and chat-template rendering, shared by the worker, the canary and verify."""
